"""How goald reaches a PostgreSQL database, apart from the store's connections
(:mod:`agent.backends`): its location as logs and messages may show it (:func:`masked`,
:func:`where`), the password systemd hands the service (:func:`credential_password`), what a
failure to reach it means (:func:`pg_failure`), and whether it sorts text as goald compares it
(:func:`check_collation`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from loguru import logger

from agent.db import Conn
from agent.errors import StorageUnavailable


def masked(dsn: str) -> str:
    """``dsn`` with any password replaced by ``***`` (what logs and status may show)."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def credential_password() -> str | None:
    """The database password from systemd's credentials (``LoadCredential=goald-pg-password:…``),
    if the service was given one; ``PGPASSWORD``/``PGPASSFILE`` are libpq's own and need nothing."""
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return None
    path = Path(directory) / "goald-pg-password"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def pg_failure(exc: BaseException, where: str) -> StorageUnavailable | None:
    """``exc`` as a :class:`StorageUnavailable` if it means the database cannot be reached."""
    if isinstance(exc, StorageUnavailable):
        return exc
    psycopg = sys.modules.get("psycopg")  # not loaded: no psycopg error can have been raised
    if psycopg is None:
        return None
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) and not isinstance(
        exc, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable
    ):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return StorageUnavailable(
            f"PostgreSQL at {where} cannot be reached: {first}",
            "check that the server is up and reachable; goald reconnects and continues by itself",
        )
    return None


def check_collation(location: str, conn: Conn) -> None:
    """Warn if the database does not sort text as bytes (goald compares ids and times as bytes)."""
    row = conn.execute("SELECT datcollate FROM pg_database WHERE datname = current_database()").fetchone()
    if row is not None and str(row[0]) not in ("C", "POSIX", "C.UTF-8", "C.utf8"):
        logger.warning(
            "the database {} sorts text by the {} collation; goald compares ids and times as bytes:"
            " create its database with LC_COLLATE 'C' (CREATE DATABASE ... TEMPLATE template0 LC_COLLATE 'C')",
            location,
            row[0],
        )


def where(dsn: str) -> str:
    """Where ``dsn`` points (host, port and database; never its user or password), for messages."""
    parts = urlsplit(dsn)
    host = parts.hostname or os.environ.get("PGHOST") or "localhost"
    port = f":{parts.port}" if parts.port else ""
    return f"{host}{port}{parts.path or ''}"


__all__ = ["check_collation", "credential_password", "masked", "pg_failure", "where"]
