"""The systemd notify protocol, spoken directly (no python-systemd dependency).

systemd hands a ``Type=notify`` service the address of a datagram socket in ``NOTIFY_SOCKET``:
a file system path, or an abstract-namespace name written with a leading ``@``. Each datagram
is newline-separated ``KEY=VALUE`` fields. goald sends ``READY=1`` once its control socket
serves, ``STATUS=`` lines, ``WATCHDOG=1`` and ``STOPPING=1``. Without ``NOTIFY_SOCKET`` every call
is a no-op, so the daemon runs the same under systemd, under another supervisor or in a terminal.

The watchdog pings come from a task on the daemon's event loop (:func:`watchdog_loop`), not from
a thread: a loop that is blocked or wedged stops pinging, and systemd restarts the service.

Sending never raises and never blocks: the socket is non-blocking, and a failed send is logged
and reported as ``False``. A supervisor that went away must not take the daemon down with it.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable, Mapping, MutableMapping

from loguru import logger

#: The environment variables systemd sets for the notify protocol.
NOTIFY_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")

#: Longest STATUS= text sent; systemd reads at most a few KiB per datagram.
MAX_STATUS_CHARS = 1024

#: How often :func:`watchdog_loop` refreshes STATUS= when systemd asked for no watchdog.
STATUS_REFRESH_SECONDS = 15.0

StatusFn = Callable[[], str | Awaitable[str]]


def notify_address(value: str | None) -> str | None:
    """The ``AF_UNIX`` address named by a ``NOTIFY_SOCKET`` value, or None when there is none.

    ``/run/systemd/notify`` is a path; ``@name`` is ``name`` in the abstract namespace (a leading
    NUL byte). Anything else (empty, relative, another transport) is not ours to speak.
    """
    if not value:
        return None
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    return None


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings: half of ``WATCHDOG_USEC``, as sd_watchdog_enabled(3) advises.

    None when systemd asked for no watchdog, when the value is malformed, or when
    ``WATCHDOG_PID`` names another process (the variables were inherited, not meant for us).
    """
    env = os.environ if environ is None else environ
    raw_usec = env.get("WATCHDOG_USEC")
    if not raw_usec:
        return None
    raw_pid = env.get("WATCHDOG_PID")
    if raw_pid:
        try:
            if int(raw_pid) != os.getpid():
                return None
        except ValueError:
            return None
    try:
        usec = int(raw_usec)
    except ValueError:
        return None
    if usec <= 0:
        return None
    return usec / 2 / 1_000_000


class Notifier:
    """A client of the notify socket; every method is a no-op when there is no socket."""

    def __init__(self, address: str | None, watchdog_interval: float | None = None) -> None:
        self.address = address
        #: Seconds between watchdog pings, or None when systemd expects none.
        self.watchdog_interval = watchdog_interval if address is not None else None
        self._sock: socket.socket | None = None
        self._failed = False

    @classmethod
    def from_env(cls, environ: MutableMapping[str, str] | None = None, *, unset_environment: bool = True) -> Notifier:
        """The notifier systemd's environment describes.

        Args:
            environ: where to read the variables (default ``os.environ``).
            unset_environment: remove the variables afterwards, so the daemon's child processes
                (sandboxed tools) do not inherit a socket and a watchdog meant for the daemon.
        """
        env = os.environ if environ is None else environ
        notifier = cls(notify_address(env.get("NOTIFY_SOCKET")), watchdog_interval(env))
        if unset_environment:
            for name in NOTIFY_ENV:
                env.pop(name, None)
        return notifier

    @property
    def enabled(self) -> bool:
        """Whether there is a socket to notify."""
        return self.address is not None

    def send(self, *fields: str) -> bool:
        """Send ``fields`` (``KEY=VALUE`` strings) as one datagram; True when it was sent."""
        if self.address is None or not fields:
            return False
        payload = "\n".join(fields).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.setblocking(False)
            self._sock.sendto(payload, self.address)
        except OSError as exc:
            # Log the first failure only: a watchdog retrying every few seconds would flood the log.
            if not self._failed:
                logger.warning("cannot notify systemd at {}: {}", self.address.replace("\0", "@"), exc)
            self._failed = True
            return False
        self._failed = False
        return True

    def ready(self, status: str | None = None) -> bool:
        """``READY=1``: the daemon serves. Send it only once the control socket accepts clients."""
        return self.send("READY=1", *_status_field(status))

    def status(self, text: str) -> bool:
        """``STATUS=``: one line shown by ``systemctl status``."""
        return self.send(*_status_field(text))

    def watchdog(self) -> bool:
        """``WATCHDOG=1``: the event loop is alive."""
        return self.send("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> bool:
        """``STOPPING=1``: a graceful shutdown has begun."""
        return self.send("STOPPING=1", *_status_field(status))

    def close(self) -> None:
        """Close the socket (a later send opens a new one)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _status_field(text: str | None) -> tuple[str, ...]:
    if text is None:
        return ()
    # A newline would start a new field: a status must never be able to say READY=1.
    line = " ".join(text.split())[:MAX_STATUS_CHARS]
    return (f"STATUS={line}",)


async def watchdog_loop(notifier: Notifier, status_fn: StatusFn | None = None) -> None:
    """Ping the watchdog from the event loop and keep STATUS= fresh, until cancelled.

    Each tick sends ``WATCHDOG=1`` first (when systemd set a watchdog), then ``STATUS=`` if the
    text from ``status_fn`` (sync or async) changed. A status that fails or takes longer than a
    tick is skipped and logged; it never delays or stops the pings. Returns at once without a
    notify socket.
    """
    if not notifier.enabled:
        return
    interval = notifier.watchdog_interval or STATUS_REFRESH_SECONDS
    loop = asyncio.get_running_loop()
    last_status: str | None = None
    deadline = loop.time()
    while True:
        if notifier.watchdog_interval is not None:
            notifier.watchdog()
        if status_fn is not None:
            text = await _current_status(status_fn, interval)
            if text is not None and text != last_status and notifier.status(text):
                last_status = text
        # Ticks keep to a fixed cadence: time spent on the status does not push the next ping back.
        deadline = max(deadline + interval, loop.time())
        await asyncio.sleep(deadline - loop.time())


async def _current_status(status_fn: StatusFn, limit: float) -> str | None:
    try:
        async with asyncio.timeout(limit):
            value = status_fn()
            if not isinstance(value, str):
                value = await value
            return value
    except asyncio.CancelledError:
        raise
    except TimeoutError:
        logger.warning("the systemd status took longer than {:.1f}s; skipped", limit)
    except Exception as exc:
        logger.warning("the systemd status failed: {}", exc)
    return None
