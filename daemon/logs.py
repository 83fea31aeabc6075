"""Logging: loguru to stderr, plain for terminals and journald-friendly otherwise."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from loguru import logger

if TYPE_CHECKING:
    from loguru import Record


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Send logs to stderr only (stdout may carry protocol messages or a command's answer)."""
    logger.remove()
    if fmt == "json":
        logger.add(sys.stderr, level=level.upper(), serialize=True)
    elif fmt == "journal":
        # journald adds its own timestamp; a syslog-style priority prefix sets the level there.
        logger.add(sys.stderr, level=level.upper(), format="{extra[prio]}{name}: {message}", filter=_journal_priority)
    else:
        logger.add(
            sys.stderr,
            level=level.upper(),
            format="<green>{time:HH:mm:ss.SSS}</green> <level>{level: <7}</level> {name}: {message}",
        )


_PRIORITIES = {"TRACE": 7, "DEBUG": 7, "INFO": 6, "SUCCESS": 5, "WARNING": 4, "ERROR": 3, "CRITICAL": 2}


def _journal_priority(record: Record) -> bool:
    record["extra"]["prio"] = f"<{_PRIORITIES.get(record['level'].name, 6)}>"
    return True
