"""The store's methods: ``store/stats`` (sizes, rows per table, largest sessions),
``store/compact`` (retention now, then every free page given back; see :mod:`goals.retention`) and
``store/backup`` (a consistent ``VACUUM INTO`` copy while the daemon serves; see :mod:`daemon.backup`).

The full ``VACUUM`` is not a method: it holds the writer for its whole run, so it is the offline
``goald store vacuum``, which refuses while a daemon holds the state directory.
"""

from __future__ import annotations

from pathlib import Path

from pydantic.alias_generators import to_camel

from agent import retention
from agent.migrate import backup_store
from daemon.ports import HostPort
from daemon.rpc.context import runtime
from daemon.rpc.params import NoParams, Params
from daemon.rpc.protocol import Dispatcher, InvalidField, Peer
from daemon.rpc.views import JsonObject
from goals.retention import compact


class StoreStats(Params):
    """``store/stats``: how many of the largest sessions to list."""

    top: int = 10


class StoreBackup(Params):
    """``store/backup``: where the copy goes (an absolute path that does not exist yet)."""

    path: str


def register(d: Dispatcher, host: HostPort) -> None:
    """Add the store's methods to ``d``."""

    @d.method("store/stats", StoreStats)
    async def stats(p: StoreStats, peer: Peer) -> JsonObject:
        store = runtime(host).store
        top = max(1, min(p.top, 1000))
        return await store.read(lambda conn: retention.database_stats(conn, store.path, top=top))

    @d.method("store/compact", NoParams)
    async def compact_now(p: NoParams, peer: Peer) -> JsonObject:
        store = runtime(host).store
        report = await compact(store, host.settings.retention.policy(host.settings.roots, host.settings.snapshots_dir))
        return {to_camel(k): v for k, v in report.model_dump(mode="json").items()}

    @d.method("store/backup", StoreBackup)
    async def backup(p: StoreBackup, peer: Peer) -> JsonObject:
        store = runtime(host).store
        dest = Path(p.path)
        if not dest.is_absolute():
            raise InvalidField(f"path must be absolute, got {p.path!r}", field="path")
        try:
            return await backup_store(store, dest)
        except OSError as exc:  # exists already, no such directory, not writable
            raise InvalidField(str(exc), field="path") from None
