"""A real PostgreSQL server for the test session, in a temporary directory of its own.

The store tests run against the real thing (Debian's packages, as CI installs them), not a fake and
not a shared server: :meth:`PgServer.start` runs ``initdb`` and ``pg_ctl start`` on a fresh cluster
under ``/tmp``, listening on a free port of 127.0.0.1 and on a unix socket inside that directory,
and every test gets a database of its own (:meth:`PgServer.create_database`), dropped afterwards.
One server serves the whole session because starting one costs most of a second (``initdb``)
while a fresh database costs a few milliseconds.

Decisions, and why:

- **Root.** ``initdb`` and ``postgres`` refuse to run as root. When the suite runs as root, the
  directory is given to the ``postgres`` user (Debian's package creates it) and every server
  binary runs as that user through :class:`subprocess.Popen`'s ``user``/``group``/``extra_groups``
  (the switch happens in the forked child before ``exec``, with no ``preexec_fn``, so it is safe
  with threads). The binaries run with the temporary directory as working directory: the
  project's own directory may not be readable by that user, and ``initdb`` fails there.
- **Settings for tests** (``fsync``, ``synchronous_commit``, ``full_page_writes`` off, no locale,
  trust authentication for the ``goald`` role): durability across a power cut is not what the
  tests check, and the speed is. ``max_connections`` is 200 because a multi-node test opens a
  writer and a listener per node besides the test's own connections.
- **Ports.** The port is found by binding port 0 and releasing it; another process may take it
  before the server binds it, so the start is retried on a new port (the log says why it failed).
- **Leftovers.** ``pg_ctl`` puts the server in a session of its own, so a Ctrl-C of pytest does
  not reach it; :meth:`PgServer.stop` runs at the end of the session and from :mod:`atexit`. A
  test run killed with SIGKILL cannot do either, so each directory records the pid of the process
  that made it, and a later start stops and removes the servers whose maker is gone (never those
  of a run still alive: several suites may run side by side).
- **Dropping.** ``DROP DATABASE … WITH (FORCE)`` terminates the database's remaining backends
  first (a store a failed test left open), so the drop never waits on them.

:data:`NO_POSTGRES` says why no server can be started here (no binaries, or root without a
``postgres`` user), or is ``None``; the ``pg_server`` fixture skips with it.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

#: The role every test connects as (made by ``initdb -U``; trusted, so no password).
USER = "goald"

_PREFIX = "goald-pg-"
_OWNER_FILE = "owner.pid"
_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "listen_addresses": "'127.0.0.1'",
}
_START_ATTEMPTS = 3
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def find_bin_dir() -> Path | None:
    """The ``bin`` directory of the highest PostgreSQL version Debian's packages installed
    (``/usr/lib/postgresql/<version>/bin``), else the directory of an ``initdb`` on ``PATH``."""
    root = Path("/usr/lib/postgresql")
    found: list[tuple[int, Path]] = []
    if root.is_dir():
        for entry in root.iterdir():
            if entry.name.isdigit() and (entry / "bin" / "initdb").is_file():
                found.append((int(entry.name), entry / "bin"))
    if found:
        return max(found)[1]
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def _run_as() -> pwd.struct_passwd | None:
    """The user the server binaries run as: ``postgres`` when we are root, else ourselves (None)."""
    if os.geteuid() != 0:
        return None
    return pwd.getpwnam("postgres")


def _why_not() -> str | None:
    if find_bin_dir() is None:
        return "no PostgreSQL server binaries (/usr/lib/postgresql/<version>/bin/initdb); install Debian's postgresql"
    try:
        _run_as()
    except KeyError:
        return "running as root and there is no 'postgres' user to run initdb and postgres as"
    return None


#: Why no PostgreSQL server can be started here, or ``None`` when one can.
NO_POSTGRES: str | None = _why_not()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class _Runner:
    """Runs the server binaries of ``bin_dir`` in ``home``, as ``user`` when given."""

    bin_dir: Path
    home: Path
    user: pwd.struct_passwd | None

    def env(self) -> dict[str, str]:
        # The PG* variables of the caller (PGHOST, PGDATA, …) would redirect the binaries.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        if self.user is not None:
            env.update(HOME=str(self.home), USER=self.user.pw_name, LOGNAME=self.user.pw_name)
        return env

    def run(self, tool: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        kw: dict[str, Any] = {}
        if self.user is not None:
            kw = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        return subprocess.run(
            [str(self.bin_dir / tool), *args],
            cwd=self.home,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **kw,
        )

    def give(self, path: Path) -> None:
        if self.user is not None:
            os.chown(path, self.user.pw_uid, self.user.pw_gid)


def reap_orphans(base: Path | None = None) -> list[Path]:
    """Stop and remove the servers of earlier runs whose making process is gone; returns their
    directories. Servers of live runs are left alone."""
    base = base or Path(tempfile.gettempdir())
    reaped: list[Path] = []
    for home in base.glob(f"{_PREFIX}*"):
        try:
            owner = int((home / _OWNER_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        if _pid_alive(owner):
            continue
        pid_file = home / "data" / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The first line of postmaster.pid is the postmaster's pid; SIGQUIT is an immediate stop.
            os.kill(int(pid_file.read_text().splitlines()[0]), signal.SIGQUIT)
        shutil.rmtree(home, ignore_errors=True)
        reaped.append(home)
    return reaped


@dataclass
class PgServer:
    """A running PostgreSQL cluster of our own. Make one with :meth:`start`; stop it with :meth:`stop`."""

    home: Path
    port: int
    bin_dir: Path
    startup_seconds: float
    _runner: _Runner = field(repr=False)
    _names: itertools.count[int] = field(default_factory=lambda: itertools.count(1), repr=False)
    _stopped: bool = field(default=False, repr=False)

    @property
    def data_dir(self) -> Path:
        """The cluster's data directory."""
        return self.home / "data"

    @property
    def socket_dir(self) -> Path:
        """The directory of the server's unix socket (a ``host=`` for libpq)."""
        return self.home / "socket"

    @property
    def log_file(self) -> Path:
        """The server's log."""
        return self.home / "server.log"

    @classmethod
    def start(cls, settings: Mapping[str, str] | None = None) -> PgServer:
        """``initdb`` a fresh cluster in a new temporary directory and start it (``pg_ctl -w``).

        Args:
            settings: server settings on top of the test defaults (``name -> value`` as written in
                ``postgresql.conf``).

        Raises:
            RuntimeError: PostgreSQL is not available here (:data:`NO_POSTGRES`), or ``initdb``
                or the start failed (the message carries its output or the log's tail).
        """
        if NO_POSTGRES is not None:
            raise RuntimeError(f"cannot start PostgreSQL: {NO_POSTGRES}")
        began = time.monotonic()
        reap_orphans()
        bin_dir = find_bin_dir()
        assert bin_dir is not None
        home = Path(tempfile.mkdtemp(prefix=_PREFIX)).resolve()
        (home / _OWNER_FILE).write_text(f"{os.getpid()}\n")
        runner = _Runner(bin_dir, home, _run_as())
        try:
            runner.give(home)
            (home / "socket").mkdir()
            runner.give(home / "socket")
            done = runner.run(
                "initdb",
                *("-D", str(home / "data"), "-A", "trust", "-U", USER, "--no-sync", "-E", "UTF8", "--no-locale"),
            )
            if done.returncode != 0:
                raise RuntimeError(f"initdb failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
            conf = {**_SETTINGS, "unix_socket_directories": f"'{home / 'socket'}'", **(settings or {})}
            with (home / "data" / "postgresql.conf").open("a") as f:
                f.write("\n# the test suite's settings\n")
                f.writelines(f"{name} = {value}\n" for name, value in conf.items())
            port = cls._start_on_free_port(runner)
        except BaseException:
            shutil.rmtree(home, ignore_errors=True)
            raise
        server = cls(home, port, bin_dir, time.monotonic() - began, runner)
        atexit.register(server.stop)
        return server

    @staticmethod
    def _start_on_free_port(runner: _Runner) -> int:
        log = runner.home / "server.log"
        failure = ""
        for _ in range(_START_ATTEMPTS):
            port = _free_port()
            done = runner.run(
                "pg_ctl",
                *("start", "-w", "-t", "30", "-s", "-D", str(runner.home / "data"), "-l", str(log)),
                *("-o", f"-p {port}"),
            )
            if done.returncode == 0:
                return port
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            failure = f"pg_ctl start failed ({done.returncode}): {done.stderr.strip()}\n{tail}"
            if "could not bind" not in tail and "already in use" not in tail:
                break
        raise RuntimeError(failure)

    def dsn(self, dbname: str = "postgres") -> str:
        """The DSN of database ``dbname`` over TCP: ``postgresql://goald@127.0.0.1:PORT/NAME``."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{dbname}"

    def _admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn("postgres"), autocommit=True)

    def create_database(self) -> str:
        """A new, empty database with a name unique in this server; returns its DSN."""
        name = f"test_{os.getpid()}_{next(self._names)}"
        with self._admin() as conn:
            create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
            if conn.info.server_version >= 150000:
                # Copying the small template's files is about twice as fast as WAL-logging it
                # block by block (15's default); a test suite makes a database per test.
                create = sql.SQL("{} STRATEGY FILE_COPY").format(create)
            conn.execute(create)
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` (its name, not its DSN), terminating its connections first.
        Dropping one that is not there does nothing.

        Raises:
            ValueError: ``name`` is not a plain database name of ours, or names the server's own.
        """
        if not _NAME.fullmatch(name) or name in ("postgres", "template0", "template1"):
            raise ValueError(f"not a test database name: {name!r}")
        with self._admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def halt(self) -> None:
        """Stop the server as an outage would (``pg_ctl stop -m fast``: every connection is cut),
        keeping its data for :meth:`restart`."""
        done = self._runner.run("pg_ctl", "stop", "-w", "-s", "-m", "fast", "-D", str(self.data_dir))
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl stop failed ({done.returncode}): {done.stderr.strip()}")

    def restart(self) -> None:
        """Start a halted server again on the same port."""
        done = self._runner.run(
            "pg_ctl",
            *("start", "-w", "-t", "30", "-s", "-D", str(self.data_dir), "-l", str(self.log_file)),
            *("-o", f"-p {self.port}"),
        )
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed ({done.returncode}): {done.stderr.strip()}")

    def stop(self) -> None:
        """Stop the server (``pg_ctl stop -m fast``) and remove its directory. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        try:
            if self.data_dir.exists():
                done = self._runner.run("pg_ctl", "stop", "-w", "-s", "-m", "fast", "-D", str(self.data_dir))
                if done.returncode != 0:
                    self._runner.run("pg_ctl", "stop", "-w", "-s", "-m", "immediate", "-D", str(self.data_dir))
        finally:
            shutil.rmtree(self.home, ignore_errors=True)


def dbname_of(dsn: str) -> str:
    """The database name at the end of a DSN made by :meth:`PgServer.dsn`."""
    return dsn.rsplit("/", 1)[1]
