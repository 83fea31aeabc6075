"""Leases: every live session is driven by one node at a time, and never orphaned when one dies.

A node holds a session by its lease row (``node_id``, ``epoch``, ``expires_at``). The lease manager
runs on a connection of its own (a renewal must not wait behind the store's writes) and, every
heartbeat (a third of the TTL), renews what it holds (a session not renewed was taken over: it is
*lost*, its agent unloaded), releases what it should let go of (draining, or idle sessions with no
live goal near its lease limit), and claims free work up to its limit (``FOR UPDATE SKIP LOCKED``;
a taken-over session is repaired for it and its subagents only: ``on_claimed``). A session is also
claimed at once when work reaches it on a node with room (``acquire``). The steps, in order:
``docs/architecture.md``, "Leases on PostgreSQL".

**Fencing**: a write that drives a session (the driver's, a goal's decision) carries with its
``COMMIT`` a check that the lease row still names this node at its epoch (:meth:`fence_at_commit`):
a node stopped or cut off past its TTL and taken over finds a higher epoch there, and its late
write is refused (:class:`~agent.errors.LeaseLost`): no second continuation, no duplicate turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from loguru import logger

from agent.backends import PgBackend
from agent.db import Conn, PgConn, pg_errors
from agent.errors import LeaseLost, StorageUnavailable
from agent.store import Store
from daemon.cluster import lease_rows as rows
from daemon.cluster.settings import ClusterSettings
from goals.store import session_node_label

T = TypeVar("T")

#: The cluster's jobs that run on one node at a time, each under a session-level advisory lock of
#: its own on the manager's connection (``pg_try_advisory_lock(JOB_CLASS, key)``): a node that dies
#: or loses its connection frees it at once, and another node's next heartbeat takes it.
JOBS = {"notifications": 1, "retention": 2}
JOB_CLASS = 0x676F616A  # not SESSION_LOCKS's: a session whose id hashes to 1 or 2 would wait on a job


def expected_failure(exc: BaseException) -> str | None:
    """What an expected, handled failure says, in one line — a lost lease (the session's new holder
    takes it from here), a store that cannot be reached (the store warns of the outage once, and
    everything goes on when it is back) — or ``None`` for anything else, a bug: logged as an error
    with its traceback. Expected events are logged as one line at warning or info, no traceback."""
    if isinstance(exc, LeaseLost):
        return str(exc)
    if isinstance(exc, StorageUnavailable):
        return exc.message
    return None


class LeaseManager:
    """This node's leases (see the module docstring). Start with :meth:`start`, stop with :meth:`stop`."""

    #: Set by the daemon: take up again the held sessions whose goals were left alone while the
    #: node drained (a drain undone before the heartbeat that would have released them).
    on_undrained: Callable[[], Awaitable[None]] | None = None

    def __init__(self, dsn: str, store: Store, settings: ClusterSettings) -> None:
        self.dsn = dsn
        self.store = store
        self.settings = settings
        self.node_id = store.node_id
        self.name = settings.node_name or socket.gethostname()
        self.ttl = settings.lease_ttl_seconds
        #: Held top-level sessions and the epoch each was claimed at.
        self.held: dict[str, int] = {}
        self.draining = False
        #: Set by the daemon: repair and adopt a session just taken (``previous``: its last holder's
        #: node id, ``None`` when it was free), and let go of one lost or released.
        self.on_claimed: Callable[[str, str | None], Awaitable[None]] | None = None
        self.on_lost: Callable[[str], Awaitable[None]] | None = None
        #: Set by the daemon: whether a held session may be released now (idle, nothing queued,
        #: ``done``: and no live goal).
        self.releasable: Callable[[str, bool], Awaitable[bool]] | None = None
        self.last_heartbeat: float | None = None
        self.last_error: str | None = None
        self.takeovers = 0
        self._roots: dict[str, str] = {}
        self._conn: PgConn | None = None
        self._exec = ThreadPoolExecutor(1, thread_name_prefix="goald-leases")
        self._loop = asyncio.get_running_loop()
        self._claiming = asyncio.Lock()
        #: Free new work seen at the last heartbeat (claimed at this one if still free).
        self._seen_fresh: set[str] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._claimer: asyncio.Task[None] | None = None
        self._spawn: Callable[[Any], Any] = asyncio.create_task
        #: Cluster jobs this node wants to run, and the ones it runs now (it holds their locks).
        self.wanted_jobs: set[str] = set()
        self.jobs: set[str] = set()
        #: Set at every heartbeat (and when the jobs held change): job runners wait on it.
        self.jobs_changed = asyncio.Event()

    # -- the manager's own connection ---------------------------------------------------------

    async def _db(self, fn: Callable[[Conn], T]) -> T:
        def run() -> T:
            conn = self._conn
            if conn is None or conn.raw.closed or conn.raw.broken:
                if self.jobs:  # the locks went with the old connection
                    self._loop.call_soon_threadsafe(self._jobs_lost)
                self._conn = conn = PgBackend.connect(self.dsn)
            conn.execute("BEGIN")
            try:
                result = fn(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction and not conn.raw.broken:
                    conn.execute("ROLLBACK")
                raise
            return result

        return await self._loop.run_in_executor(self._exec, run)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, spawn: Callable[[Any], Any]) -> None:
        """Register this node, install the fence and start the heartbeat."""
        labels = list(self.settings.labels)
        await self._db(
            lambda conn: rows.register_node(conn, self.node_id, self.name, labels, self.settings.lease_limit)
        )
        self.last_heartbeat = time.monotonic()
        self.store.fence = self.fence
        self.store.fence_at_commit = self.fence_at_commit
        logger.info("node {} ({}) joined the cluster; lease TTL {:g}s", self.name, self.node_id, self.ttl)
        self._spawn = spawn
        self._task = spawn(self._heartbeats())

    async def halt(self) -> None:
        """Stop renewing and claiming (before the drivers stop; the leases are kept until :meth:`stop`)."""
        claimer, self._claimer = self._claimer, None
        if claimer is not None and not claimer.done():
            claimer.cancel()
            await asyncio.wait({claimer})
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def stop(self) -> None:
        """Stop renewing and claiming; free every held lease at once (the drivers have stopped), so
        the other nodes take the sessions over without waiting for the TTL."""
        await self.halt()

        try:
            freed = await self._db(lambda conn: rows.leave(conn, self.node_id))
            logger.info("node {} left the cluster; {} sessions handed back", self.name, freed)
        except pg_errors() as exc:
            logger.warning(
                "node {} could not hand its sessions back ({}); they expire in {:g}s", self.name, exc, self.ttl
            )
        self.held.clear()
        await self._loop.run_in_executor(self._exec, self._close)
        self._exec.shutdown(wait=False)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def kick(self) -> None:
        """Heartbeat now (new free work was seen, or a drain was asked)."""
        self._wake.set()

    async def _heartbeats(self) -> None:
        while True:
            try:
                await self.beat()
            except pg_errors() as exc:
                if self.last_error is None:
                    logger.warning("node {}: cannot renew leases ({}); retrying", self.name, exc)
                self.last_error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.heartbeat_seconds):
                    await self._wake.wait()
            self._wake.clear()

    async def beat(self) -> None:
        """One heartbeat: renew, notice losses, release what is done, claim free work."""
        renewed, draining = await self._db(lambda conn: rows.renew(conn, self.node_id, self.ttl))
        if self.last_error is not None:
            logger.info("node {}: renewing leases again", self.name)
            self.last_error = None
        self.last_heartbeat = time.monotonic()
        if draining != self.draining:
            self.draining = draining
            logger.info(
                "node {} {}",
                self.name,
                "drains: its sessions go back at their next idle" if draining else "takes work again",
            )
            if not draining and self.on_undrained is not None:
                await self.on_undrained()
        for sid, epoch in list(self.held.items()):
            if renewed.get(sid) != epoch:
                await self._lose(sid, "another node took it over while this one could not renew")
        await self._release_done()
        # In the background: taking up many sessions (each repaired and adopted) must not delay the
        # next renewal past the TTL, or this node would lose what it holds.
        if not self.draining and (self._claimer is None or self._claimer.done()):
            self._claimer = self._spawn(self._claim_quietly())
        await self._take_jobs()
        self.jobs_changed.set()

    # -- the cluster's jobs ---------------------------------------------------------------------

    def runs(self, job: str) -> bool:
        """Whether this node runs ``job`` now (it holds the job's lock)."""
        return job in self.jobs

    async def _take_jobs(self) -> None:
        for job in sorted(self.wanted_jobs - self.jobs):
            key = JOBS[job]
            if await self._db(lambda conn, key=key: rows.try_job_lock(conn, JOB_CLASS, key)):  # type: ignore[misc]
                self.jobs.add(job)
                logger.info("node {} runs the cluster's {}", self.name, job)

    def _jobs_lost(self) -> None:
        if self.jobs:
            logger.warning("node {} lost its database connection; it no longer runs {}", self.name, sorted(self.jobs))
        self.jobs.clear()
        self.jobs_changed.set()

    # -- holding ------------------------------------------------------------------------------

    def root(self, session_id: str) -> str:
        """The top-level session whose lease covers ``session_id`` (itself, unless a known subagent)."""
        return self._roots.get(session_id, session_id)

    def holds(self, session_id: str) -> bool:
        """Whether this node holds the session (a subagent's: its top-level session's lease)."""
        return self.root(session_id) in self.held

    async def acquire(self, session_id: str) -> str | None:
        """Hold ``session_id`` now if it is free and this node has room: ``None`` if held after,
        else who drives it (or why this node does not take it)."""
        root = await self._root(session_id)
        if root in self.held:
            return None
        if self.draining:
            return "no node yet (this node is draining; another node takes it at its next heartbeat)"
        if len(self.held) >= self.settings.lease_limit:
            return f"no node yet (this node holds its limit of {self.settings.lease_limit} sessions)"
        need = await self._db(lambda conn: session_node_label(conn, root))
        if need is not None and need not in self.settings.labels:
            return f"no node yet here (its goal needs a node labelled {need!r}; this node is not)"
        taken = await self._claim([root])
        if root in taken or root in self.held:  # or claimed meanwhile by this node (a wake's load)
            return None
        return await self._db(lambda conn: rows.holder(conn, root))

    async def _claim_quietly(self) -> None:
        try:
            await self.claim_free()
        except pg_errors() as exc:
            logger.debug("node {}: claiming free work failed ({}); the next heartbeat tries again", self.name, exc)

    async def claim_free(self) -> int:
        """Claim free work up to the lease limit; returns how many sessions were taken."""
        room = self.settings.lease_limit - len(self.held)
        if room <= 0:
            return 0
        labels = set(self.settings.labels)
        fresh, expired = await self._db(lambda conn: rows.candidates(conn, labels))
        # A dead node's sessions at once (the takeover bound is TTL plus one heartbeat); new work only
        # once it has waited a heartbeat, so the node it arrived through (which claims it as it
        # commits, through ``acquire``) keeps it: its agent is loaded there, its caller is there.
        ripe = fresh & self._seen_fresh
        self._seen_fresh = fresh
        candidates = sorted(expired) + sorted(ripe - expired)
        if not candidates:
            return 0
        return len(await self._claim(candidates[:room]))

    async def _claim(self, sessions: list[str]) -> list[str]:
        async with self._claiming:
            room = self.settings.lease_limit - len(self.held)
            wanted = [s for s in sessions if s not in self.held][: max(room, 0)]
            if not wanted:
                return []
            taken = await self._db(lambda conn: rows.take(conn, self.node_id, self.ttl, wanted))
            for sid, (epoch, previous) in taken.items():
                self.held[sid] = epoch
                if previous is not None:
                    self.takeovers += 1
                    logger.warning(
                        "node {} took over session {} from node {} (epoch {}): repairing it first",
                        self.name,
                        sid,
                        previous,
                        epoch,
                    )
                if self.on_claimed is not None:
                    try:
                        await self.on_claimed(sid, previous)
                    except Exception as exc:
                        if (why := expected_failure(exc)) is None:
                            logger.exception("could not take up session {}", sid)
                        else:
                            logger.warning("could not take up session {} now: {}", sid, why)
            return list(taken)

    async def release(self, session_id: str, why: str) -> None:
        """Hand a held session back (free for any node to claim), then let go of it here."""
        epoch = self.held.get(session_id)
        if epoch is None:
            return

        await self._db(lambda conn: rows.hand_back(conn, session_id, self.node_id, epoch))
        logger.debug("node {} released session {}: {}", self.name, session_id, why)
        await self._let_go(session_id)

    async def _release_done(self) -> None:
        # Draining: every session at its idle. Otherwise only near the limit: idle sessions with no
        # live goal make room (a session keeps its node while there is room, so a follow-up sent
        # through any node reaches the node that has its agent loaded).
        if self.releasable is None:
            return
        if not self.draining and len(self.held) < 0.9 * self.settings.lease_limit:
            return
        for sid in list(self.held):
            if await self.releasable(sid, not self.draining):
                await self.release(sid, "drained at its idle" if self.draining else "idle with nothing to do")

    async def _lose(self, session_id: str, why: str) -> None:
        logger.warning("node {} lost session {}: {}", self.name, session_id, why)
        await self._let_go(session_id)

    async def _let_go(self, session_id: str) -> None:
        self.held.pop(session_id, None)
        if self.on_lost is not None:
            try:
                await self.on_lost(session_id)
            except Exception as exc:
                if (why := expected_failure(exc)) is None:
                    logger.exception("could not let go of session {}", session_id)
                else:
                    logger.info("letting go of session {}: {}", session_id, why)

    async def _root(self, session_id: str) -> str:
        root = self._roots.get(session_id)
        if root is not None:
            return root
        root = await self._db(lambda conn: rows.root_of(conn, session_id))
        self._roots[session_id] = root
        return root

    # -- fencing (on the store thread, inside the writing transaction) ---------------------------

    def fence(self, conn: Conn, session_id: str) -> None:
        """Refuse the transaction unless this node still holds the session's lease at the epoch it
        claimed (see the module docstring)."""
        root = self._roots.get(session_id)
        if root is None:
            root = self._roots[session_id] = rows.root_of(conn, session_id)
        epoch = self.held.get(root)
        row = rows.lease_of(conn, root)
        if epoch is not None and row is not None and row[0] == self.node_id and row[1] == epoch:
            return
        holder = f"node {row[0]} (epoch {row[1]})" if row is not None and row[0] is not None else "no node"
        if epoch is not None:
            self._loop.call_soon_threadsafe(self._lost_soon, root)
        raise LeaseLost(
            f"lease lost for session {root}: node {self.name} no longer holds it (now {holder}); nothing was written"
        )

    def fence_at_commit(self, conn: Conn, session_id: str) -> str:
        """The statement that makes the transaction's ``COMMIT`` fail unless this node still holds
        the session's lease at the epoch it claimed: sent with the ``COMMIT``, in its round trip
        (:class:`agent.tx.Tx`'s ``fence``). Under the session's lock, as :meth:`fence` reads the row;
        if the statement fails the store calls :meth:`fence` after the rollback, which raises
        :class:`LeaseLost` with the holder it finds. This node holding no lease for it: checked now."""
        root = self._roots.get(session_id)
        if root is None:
            root = self._roots[session_id] = rows.root_of(conn, session_id)
        epoch = self.held.get(root)
        if epoch is None:
            self.fence(conn, session_id)  # raises: nothing to wait for
        return rows.fence_statement(root, self.node_id, int(epoch or 0))

    def _lost_soon(self, session_id: str) -> None:
        if session_id in self.held:
            # Owned by the runtime's task group (its failures logged there), not an orphan task.
            lose = self._lose(session_id, "a write found its lease taken")
            try:
                self._spawn(lose)
            except RuntimeError:  # the runtime has stopped: nothing is left to let go of
                lose.close()

    # -- views --------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """This node as ``daemon/health`` shows it."""
        age = time.monotonic() - self.last_heartbeat if self.last_heartbeat is not None else None
        return {
            "nodeId": self.node_id,
            "name": self.name,
            "labels": sorted(set(self.settings.labels)),
            "held": len(self.held),
            "leaseLimit": self.settings.lease_limit,
            "leaseTtlSeconds": self.ttl,
            "draining": self.draining,
            "takeovers": self.takeovers,
            "jobs": sorted(self.jobs),
            "lastHeartbeatSecondsAgo": round(age, 3) if age is not None else None,
            "error": self.last_error,
        }

    async def nodes(self) -> list[dict[str, Any]]:
        """Every node that has not left, with its leases and last heartbeat (the cluster view)."""

        return await self._db(lambda conn: rows.node_views(conn, self.node_id, self.ttl))

    async def drain(self, node: str | None, undo: bool = False) -> list[str]:
        """Ask a node (by name or id; ``None``: this one) to hand its sessions back at their next idle
        (``undo``: to take work again); returns the ids of the nodes asked."""
        target = node or self.node_id

        asked = await self._db(lambda conn: rows.mark_draining(conn, target, undo))
        if self.node_id in asked:
            self.kick()
        return asked

    def drives(self, session_id: str) -> bool:
        """Whether this node's goal engine decides for the session: it holds it and is not draining.
        A draining node makes no new decision, so its goals' sessions come to rest at their next
        idle, where they are released and the node that takes each one decides there instead."""
        return self.holds(session_id) and not self.draining

    async def holders(self, session_ids: list[str]) -> dict[str, str]:
        """The name of the node that holds each of ``session_ids`` (top-level sessions) now; a session
        no live lease holds is left out (the status page's "node" of a goal)."""
        if not session_ids:
            return {}

        return await self._db(lambda conn: rows.holder_names(conn, session_ids))


__all__ = ["LeaseManager", "expected_failure"]
