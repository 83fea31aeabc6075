"""Logging: loguru sinks for a terminal, the systemd journal's native protocol, and JSON lines.

Which sink (:func:`setup_logging`):

- **the journal, natively**, when stderr *is* the journal: systemd sets ``JOURNAL_STREAM`` to the
  device and inode of the stream it connected stderr to, and only a matching stderr counts (a
  child whose stderr was redirected elsewhere inherits the variable but not the stream). With
  ``log_format = "journal"`` (the shipped units) ``INVOCATION_ID`` is enough. Each line is one
  datagram to the journal's socket (``/run/systemd/journal/socket``, setting ``journal_socket``)
  with ``MESSAGE``, ``PRIORITY``, ``SYSLOG_IDENTIFIER``, the code location, and the structured
  fields ``GOAL_ID=`` and ``SESSION_ID=`` on every line about a goal or a session, so
  ``journalctl GOAL_ID=goal_…`` shows one goal's story; whatever else the caller bound goes along
  in upper case (``goal_key`` → ``GOAL_KEY``). The protocol is written here (a few lines)
  rather than through a C binding. A datagram the journal refuses (too large, the socket gone)
  falls back to a plain stderr line, never to silence;
- **JSON lines** on stderr with ``log_format = "json"``: one object per line with ``time``,
  ``level``, ``logger``, ``message``, the same ids as ``goal_id`` / ``session_id``, and what the
  caller bound under ``extra``;
- **plain text** on stderr otherwise (``journal`` outside systemd keeps its ``<N>`` priority
  prefix, which journald reads from a stream). Stderr lines carry no fields.

Which goal or session a line is about: the ids bound with ``logger.bind(goal_id=…,
session_id=…)`` or ``logger.contextualize(…)``, else the first ``goal_…`` / ``ses_…`` id in the
message itself. Every id has a type prefix and a fixed-length body (:mod:`agent.ids`), so finding
them in the text is exact, and lines written long before this module existed carry fields too.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from loguru import logger

if TYPE_CHECKING:
    from loguru import Message, Record

#: The journal's native socket (systemd's default path).
JOURNAL_SOCKET = Path("/run/systemd/journal/socket")

_PRIORITIES = {"TRACE": 7, "DEBUG": 7, "INFO": 6, "SUCCESS": 5, "WARNING": 4, "ERROR": 3, "CRITICAL": 2}
_ID_BODY = "[0-9A-HJKMNP-TV-Z]{26}"
_GOAL_ID = re.compile(rf"\bgoal_{_ID_BODY}\b")
_SESSION_ID = re.compile(rf"\bses_{_ID_BODY}\b")
_FIELD_NAME = re.compile(r"[^A-Z0-9_]")
#: The journal takes datagrams up to its socket's buffer; longer messages are cut to this.
MAX_MESSAGE = 48 * 1024


def setup_logging(level: str = "INFO", fmt: str = "text", *, journal_socket: Path | None = None) -> None:
    """Send logs to the journal (under systemd) or stderr (stdout may carry protocol messages or a
    command's answer). ``journal_socket``: where the journal listens (``None``: never natively)."""
    logger.remove()
    level = level.upper()
    if journal_socket is not None and fmt != "json" and under_journal(fmt):
        sink = JournalSink(journal_socket)
        logger.add(sink.write, level=level, format="{message}")
        return
    if fmt == "json":
        logger.add(JsonLines(sys.stderr).write, level=level, format="{message}")
    elif fmt == "journal":
        # journald adds its own timestamp; a syslog-style priority prefix sets the level there.
        logger.add(sys.stderr, level=level, format="{extra[prio]}{name}: {message}", filter=_journal_priority)
    else:
        logger.add(
            sys.stderr,
            level=level,
            format="<green>{time:YYYY-MM-DD HH:mm:ss.SSSZ}</green> <level>{level: <7}</level> {name}: {message}",
        )


def under_journal(fmt: str = "text") -> bool:
    """Whether stderr is connected to the journal (``JOURNAL_STREAM`` names this very stderr), or,
    with ``fmt == "journal"``, the process runs as a systemd unit (``INVOCATION_ID``)."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    if stream:
        try:
            dev, ino = (int(x) for x in stream.split(":", 1))
            st = os.fstat(sys.stderr.fileno())
        except (ValueError, OSError, AttributeError):
            pass
        else:
            if (st.st_dev, st.st_ino) == (dev, ino):
                return True
    return fmt == "journal" and bool(os.environ.get("INVOCATION_ID"))


def _journal_priority(record: Record) -> bool:
    record["extra"]["prio"] = f"<{_PRIORITIES.get(record['level'].name, 6)}>"
    return True


def subject_ids(record: Record) -> tuple[str | None, str | None]:
    """The goal and session a log record is about: bound ids first, else ids in its message."""
    extra = record["extra"]
    goal = extra.get("goal_id")
    session = extra.get("session_id")
    if goal is None:
        found = _GOAL_ID.search(record["message"])
        goal = found.group(0) if found else None
    if session is None:
        found = _SESSION_ID.search(record["message"])
        session = found.group(0) if found else None
    return (str(goal) if goal is not None else None, str(session) if session is not None else None)


def _text(record: Record) -> str:
    text = record["message"]
    exc = record["exception"]
    if exc is not None and exc.type is not None:
        import traceback  # only for the rare line that carries a traceback

        text += "\n" + "".join(traceback.format_exception(exc.type, exc.value, exc.traceback)).rstrip()
    return text


def _field(name: str, value: str) -> bytes:
    data = value.encode("utf-8", "replace")
    if b"\n" not in data:
        return name.encode() + b"=" + data + b"\n"
    # A value with a newline: the name, a newline, its length as 64-bit little-endian, the bytes.
    return name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"


def journal_datagram(record: Record) -> bytes:
    """One record in the journal's native protocol."""
    text = _text(record)
    if len(text) > MAX_MESSAGE:
        text = text[:MAX_MESSAGE] + " …(cut)"
    goal, session = subject_ids(record)
    fields = [
        ("MESSAGE", text),
        ("PRIORITY", str(_PRIORITIES.get(record["level"].name, 6))),
        ("SYSLOG_IDENTIFIER", "goald"),
        ("CODE_FILE", record["file"].path),
        ("CODE_LINE", str(record["line"])),
        ("CODE_FUNC", record["function"]),
        ("GOALD_LOGGER", record["name"] or ""),
    ]
    for key, value in sorted(record["extra"].items()):
        name = _FIELD_NAME.sub("_", key.upper()).lstrip("_")
        if value is not None and name and name not in ("GOAL_ID", "SESSION_ID", "PRIO"):
            fields.append((name, str(value)))  # what the caller bound: goal_key → GOAL_KEY, …
    if goal is not None:
        fields.append(("GOAL_ID", goal))
    if session is not None:
        fields.append(("SESSION_ID", session))
    return b"".join(_field(k, v) for k, v in fields)


class JournalSink:
    """Writes each record as one datagram to the journal's socket (from any thread)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._lock = threading.Lock()

    def write(self, message: Message) -> None:
        """The loguru sink."""
        record = message.record
        data = journal_datagram(record)
        try:
            with self._lock:
                self._sock.sendto(data, self.path)
        except OSError:
            # Too large for the socket, or the journal is gone: the line still goes out, plainly.
            sys.stderr.write(f"<{_PRIORITIES.get(record['level'].name, 6)}>{record['name']}: {_text(record)}\n")


class JsonLines:
    """Writes each record as one JSON object per line."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, message: Message) -> None:
        """The loguru sink."""
        record = message.record
        goal, session = subject_ids(record)
        line: dict[str, Any] = {
            "time": record["time"].isoformat(),
            "level": record["level"].name,
            "logger": record["name"],
            "message": _text(record),
        }
        if goal is not None:
            line["goal_id"] = goal
        if session is not None:
            line["session_id"] = session
        extra = {k: v for k, v in record["extra"].items() if k not in ("goal_id", "session_id", "prio")}
        if extra:
            line["extra"] = extra  # what the caller bound (the goal's key, status and reason, …)
        self.stream.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
        self.stream.flush()
