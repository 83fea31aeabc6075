"""The CLI's ``goald store stats|compact`` (through the daemon), ``goald store vacuum`` (offline) and
``goald store backup PATH`` (through the daemon when one holds the store, else offline) and
``goald store restore BACKUP`` (offline only).

``vacuum`` rewrites the whole database with a full ``VACUUM``, which holds the writer for its whole
run; it is therefore offline only: it takes the state directory's lock (:mod:`daemon.lock`) first
and refuses, changing nothing, while a daemon holds it. It is also how a database created before
incremental auto-vacuum switches to it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

from agent import retention
from agent.pgaccess import masked
from daemon.backup import backup_offline, restore_offline
from daemon.client import Connection, DaemonUnavailable
from daemon.lock import StateDirLocked, StateLock
from daemon.rpc.protocol import RpcError


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def print_stats(s: dict[str, Any]) -> None:
    """The ``store/stats`` answer, for a person."""
    print(f"database {s['path']}: {_mib(s['fileBytes'])} (with its WAL), auto_vacuum {s['autoVacuum']}")
    print(f"pages {s['pages']} of {s['pageSize']} B, free {s['freePages']} ({_mib(s['freeBytes'])})")
    print("rows per table:")
    for table, n in sorted(s["rows"].items()):
        print(f"  {table:<16} {n:>10}")
    print("largest sessions (bytes of stored events):")
    for r in s["largestSessions"]:
        seqs = f"seq {r['firstSeq']}..{r['lastSeq']}"
        print(f"  {r['sessionId']}  {r['events']:>8} events  {_mib(r['eventBytes']):>12}  {seqs}")


async def store_command(client: Connection, args: argparse.Namespace) -> int:
    """Run ``store stats`` or ``store compact`` against the daemon."""
    if args.store_command == "stats":
        stats = await client.call("store/stats", {"top": args.top})
        if args.json:
            print(json.dumps(stats, indent=2))
        else:
            print_stats(stats)
        return 0
    report = await client.call("store/compact", {})
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"pruned {report['goalsPruned']} ended goals ({report['events']} events, {_mib(report['eventBytes'])}),"
            f" removed {len(report['workdirsRemoved'])} work directories; freed {report['pagesFreed']} pages;"
            f" {_mib(report['bytesBefore'])} -> {_mib(report['bytesAfter'])};"
            f" {report['steps']} steps, longest {report['longestHoldSeconds'] * 1000:.1f} ms"
        )
    return 0


#: What ``store backup`` and ``store vacuum`` say on PostgreSQL, where they are the server's business.
PG_BACKUP = (
    "the store is PostgreSQL ({}): back it up with PostgreSQL's own tools — pg_dump for a copy"
    " (pg_dump -Fc -f goald.dump DBNAME), pg_basebackup with WAL archiving for point-in-time recovery"
)
PG_RESTORE = (
    "the store is PostgreSQL ({}): restore it with PostgreSQL's own tools — pg_restore for a pg_dump copy"
    " (pg_restore -d DBNAME goald.dump), with every goald node stopped"
)
PG_VACUUM = "the store is PostgreSQL ({}): its autovacuum reuses the space; VACUUM FULL is the operator's (psql)"


def _pg(settings: Any, template: str) -> int | None:
    if getattr(settings, "store", None) is None:
        return None
    print(f"goald: {template.format(masked(settings.store))}", file=sys.stderr)
    return 64


def vacuum(settings: Any) -> int:
    """``goald store vacuum``: the offline full ``VACUUM`` (exit 75 while a daemon holds the state dir)."""
    if (code := _pg(settings, PG_VACUUM)) is not None:
        return code
    state_dir = settings.state_dir.expanduser()
    lock = StateLock(state_dir, settings.database_path)
    try:
        lock.acquire()
    except StateDirLocked as exc:
        print(f"goald: {exc}; stop the daemon first (a full VACUUM holds the database for its whole run)",
              file=sys.stderr)  # fmt: skip
        return 75
    try:
        try:
            result = retention.vacuum_offline(settings.database_path)
        except FileNotFoundError as exc:
            print(f"goald: {exc}", file=sys.stderr)
            return 1
    finally:
        lock.release()
    print(
        f"vacuumed {result['path']}: {_mib(result['bytesBefore'])} -> {_mib(result['bytesAfter'])},"
        f" auto_vacuum {result['autoVacuumBefore']} -> {result['autoVacuum']}"
    )
    return 0


async def _backup_online(socket_path: Path, dest: Path) -> dict[str, Any] | None:
    """The daemon's ``store/backup`` answer, or ``None`` when no daemon answers on ``socket_path``."""
    try:
        client = await Connection.connect(socket_path)
    except DaemonUnavailable:
        return None
    try:
        answer: dict[str, Any] = await client.call("store/backup", {"path": str(dest)})
        return answer
    finally:
        await client.close()


def backup(settings: Any, socket_path: Path, path: Path) -> int:
    """``goald store backup PATH``: a consistent copy of the database at ``PATH`` (which must not
    exist), made by the running daemon, or here under the state lock when none runs."""
    if (code := _pg(settings, PG_BACKUP)) is not None:
        return code
    dest = path.expanduser().absolute()  # the daemon's working directory is not ours
    try:
        answer = asyncio.run(_backup_online(socket_path, dest))
    except RpcError as exc:
        print(f"goald: backup refused: {exc.message}", file=sys.stderr)
        return 1
    except ConnectionError as exc:
        print(f"goald: {exc}", file=sys.stderr)
        return 69
    if answer is not None:
        print(f"backed up {settings.database_path} to {answer['path']} ({_mib(answer['bytes'])}, online)")
        return 0
    lock = StateLock(settings.state_dir.expanduser(), settings.database_path)
    try:
        lock.acquire()
    except StateDirLocked as exc:
        print(f"goald: {exc}; it does not answer on {socket_path} (wait until it serves)", file=sys.stderr)
        return 75
    try:
        size = backup_offline(settings.database_path, dest)
    except OSError as exc:  # no database, the copy exists already, no such directory, not writable
        print(f"goald: backup refused: {exc}", file=sys.stderr)
        return 1
    finally:
        lock.release()
    print(f"backed up {settings.database_path} to {dest} ({_mib(size)}, offline)")
    return 0


def restore(settings: Any, path: Path, *, replace: bool = False) -> int:
    """``goald store restore BACKUP``: the backup file copied into the state directory's database,
    offline only (exit 75 while a daemon holds the state dir), then ``PRAGMA integrity_check``
    (exit 1 unless it answers ``ok``)."""
    if (code := _pg(settings, PG_RESTORE)) is not None:
        return code
    state_dir = settings.state_dir.expanduser()
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = StateLock(state_dir, settings.database_path)
    try:
        lock.acquire()
    except StateDirLocked as exc:
        print(f"goald: {exc}; stop the daemon first (a restore replaces its database)", file=sys.stderr)
        return 75
    try:
        check = restore_offline(path.expanduser().absolute(), settings.database_path, replace=replace)
    except (OSError, sqlite3.DatabaseError) as exc:
        print(f"goald: restore refused: {exc}", file=sys.stderr)
        return 1
    finally:
        lock.release()
    print(f"restored {path} to {settings.database_path}; integrity_check: {check}")
    return 0 if check == "ok" else 1
