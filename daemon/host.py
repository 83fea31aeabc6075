"""The host: the long-running process that holds the store, the sessions, the goal engine, the
scheduler and the control server, all inside one ``asyncio.TaskGroup``.

Start order: state directory → its lock (a second daemon stops here, having written nothing:
:mod:`daemon.lock`) → store (crash repair) → goal engine (listening; no goal
loaded yet) → scheduler (missed
fires applied) → control socket → ``READY=1``. Nothing before ``READY=1`` is done per goal or
per event (the live goals' secrets are read in one indexed pass): the engine loads the live goals
and makes their pending decisions right after, then the sessions with queued work resume, in
that order, so a goal that must stop does so before its session runs again.
Stop order (SIGTERM/SIGINT, or the ``shutdown``
method): ``STOPPING=1`` → the socket and the scheduler stop taking work (a request in flight, such as the
call that stopped the daemon, still writes its answer) → running turns get the
grace period to reach a safe point, else end ``interrupted`` → the store closes → exit 0.
SIGHUP reloads declared goals and schedules by ``key``. The configured MCP servers start before the
store opens (sessions' tool lists are built from their listings) and stop after it closes.

The host is the lifecycle; its parts live beside it: the session resolver and the sandboxes of
shell calls and goal commands (:mod:`daemon.host_sessions`), what it reports about itself
(:mod:`daemon.host_status`), the run state (:mod:`daemon.run_state`), the start-up checks
(:mod:`daemon.startup`), the MCP servers' sandboxes (:mod:`daemon.mcp_servers`) and the services
started after ``READY=1`` (:mod:`daemon.ready_services`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from loguru import logger

from agent import (
    McpServers,
    ModelRegistry,
    Runtime,
    SandboxProfile,
)
from agent.models.health import ProviderHealth
from daemon.alerts import Alerts
from daemon.alerts.rpc import register as register_notify
from daemon.backup import upgrade_store
from daemon.cluster import LeaseManager
from daemon.cluster.node import join
from daemon.declared import GoalsFileError, apply_declared
from daemon.disk import StoreDisk
from daemon.goal_sandbox import goal_disk_limit
from daemon.host_sessions import HostSessions
from daemon.host_status import HostStatus, dump_tasks
from daemon.lock import StateLock
from daemon.mcp_servers import build_mcp_servers
from daemon.metrics import LoopLag, Metrics, SlotSemaphore
from daemon.metrics_service import MetricsService
from daemon.models import build_registry
from daemon.network_events import NetworkEvents
from daemon.notify import Notifier
from daemon.ready_services import ReadyServices
from daemon.rpc.branches import commit_on_completion
from daemon.rpc.methods import build_dispatcher
from daemon.rpc.server import raise_nofile_limit, serve_stdio
from daemon.run_state import RunState, transition_run_state
from daemon.schedule.firing import GoalFiring
from daemon.schedule.service import Scheduler
from daemon.settings import ConfigError, Settings, load_settings, sandbox_profile
from daemon.startup import (
    check_goals_file,
    prepare_state_dir,
    prepare_work_roots,
    socket_group_id,
    start_control_socket,
)
from daemon.web.links import AnswerLinks
from daemon.web.listen import bind_listeners
from daemon.workdirs import Workdirs
from goals import (
    FingerprintLimits,
    GoalEngine,
    goal_counts,
    sandboxed_runner,
)
from goals.snapshots import Snapshots
from goals.timers import Reminders


async def _step(what: str, done: Awaitable[object]) -> None:
    """One step of stopping, logged with how long it took (a stop that hangs names its step)."""
    start = time.monotonic()
    logger.debug("daemon stopping: {}", what)
    await done
    logger.debug("daemon stopping: {} stopped in {:.2f}s", what, time.monotonic() - start)


class Host(HostSessions, HostStatus):
    """One daemon process. ``await Host(settings).run()`` serves until stopped."""

    def __init__(self, settings: Settings, *, models: ModelRegistry | None = None) -> None:
        self.settings = settings
        self.healths: dict[str, ProviderHealth] = {}
        #: Providers found in the configuration file by a reload that were not there at start, with the file.
        self.added_providers: dict[str, str] = {}
        self.models = models or build_registry(settings, self.healths, added=lambda: self.added_providers)
        self.state = RunState.STARTING
        self.started = time.monotonic()
        self.rt: Runtime | None = None
        self.engine: GoalEngine | None = None
        #: This node's leases (a daemon on PostgreSQL: daemon.cluster), else None.
        self.leases: LeaseManager | None = None
        self.scheduler: Scheduler | None = None
        self._stop = asyncio.Event()
        self._slots = SlotSemaphore(settings.max_concurrent_turns)  # counts the turns waiting (metrics)
        #: Metrics file and endpoint (``[metrics]``); built when the store is open.
        self.metrics: MetricsService | None = None
        #: systemd notifications; read from the environment when the daemon starts serving.
        self._notifier = Notifier(None)
        self.ready = asyncio.Event()
        #: How commands are sandboxed; detected when the daemon starts.
        self.sandboxing = SandboxProfile(unavailable="the daemon has not started")
        self.mcp = McpServers()
        #: Notifications (``[notify]``): the outbox's sender, breaker watching, ``notify test``.
        #: The signed answer links of question notifications (their key is made at the first start).
        self.links = AnswerLinks(settings.state_dir, settings.web.base_url())
        self.alerts = Alerts(settings.notify, lambda: self.sandboxing, decorate=self.links.decorate)
        #: Where sessions and goals work, inside the allowed roots.
        self.workdirs = Workdirs(settings.roots)
        #: The network proxy's reports as ``sandbox/network`` events; made when the store is open.
        self.network_events: NetworkEvents | None = None
        #: The disk holding the store: its watermark and the store's reserve (``[storage]``).
        self.disk = StoreDisk(
            settings.database_path.parent if settings.store is None else settings.state_dir.expanduser(),
            settings.storage,
            reserve=settings.store is None,
        )

    # -- lifecycle -------------------------------------------------------------------------

    def _set_state(self, target: RunState) -> None:
        self.state = transition_run_state(self.state, target)
        logger.info("daemon {}", self.state.value)

    def request_stop(self) -> None:
        """Begin a graceful shutdown."""
        self._stop.set()

    async def run(self, *, stdio: bool = False, start_line: str | None = None) -> int:
        """Serve until stopped; returns the exit code. ``start_line`` (the version and the
        configuration in use) is logged once the locks are held, so a refusal stays one line.

        Raises:
            StateDirLocked: another process holds the state directory; nothing was written.
        """
        state_dir = self.settings.state_dir.expanduser()
        # Before anything is written or logged: an unusable state directory is one line and exit 78
        # (not a traceback and exit 1, which systemd would restart for ever).
        prepare_state_dir(state_dir)
        # Before the store is opened or repaired, and before the socket is touched (daemon.lock);
        # the database's own lock too, wherever it lies: two state directories, one database.
        # On PostgreSQL the database is shared by design (each session leased to one node: daemon.cluster);
        # the state directory stays this daemon's own.
        pg = self.settings.store
        lock = StateLock(state_dir, None if pg is not None else self.settings.database_path)
        lock.acquire()
        if start_line is not None:
            logger.info(start_line)
        try:
            return await self._serve(stdio=stdio)
        finally:
            lock.release()

    async def _serve(self, *, stdio: bool) -> int:
        s = self.settings
        group = self._before_store()
        # Before anything opens the store: a pending schema step is applied after a copy, all or nothing
        # (a failure raises MigrationFailed, the database unchanged; daemon.backup).
        await upgrade_store(s)
        # [web]: its address bound now, so a port in use stops the start before the store opens.
        web_sockets = bind_listeners(s.web) if s.web.enabled else []
        self.mcp = await build_mcp_servers(s)
        # The reserve in place (or, on a disk already full, given back so that the store can open).
        await asyncio.to_thread(self.disk.before_open)
        async with (
            self.mcp,
            Runtime.open(
                s.store_location,
                durability=s.durability,
                connections=s.store_connections,
                resolver=self._resolve,
                grace=s.shutdown_grace_seconds,
                resume=False,
                repair_all=s.store is None,  # a node repairs each session as it takes it over
            ) as rt,
        ):
            self.rt = rt
            self.network_events = NetworkEvents(rt.store, rt.spawn)
            rt.store.reserve = self.disk.reserve
            disk_watch = rt.spawn(self.disk.watch())
            self.alerts.watch_breakers(self.healths, rt)
            engine = await self._start_engine(rt)
            await self._start_scheduler()
            dispatcher = build_dispatcher(self)
            register_notify(dispatcher, self.alerts)
            server = await start_control_socket(s, dispatcher, group)
            try:
                page = await self._start_web(dispatcher, rt, web_sockets)  # [web]: the status page, if enabled
            except BaseException:
                await server.stop()
                raise
            stdio_task = rt.spawn(self._stdio(serve_stdio, dispatcher)) if stdio else None
            if s.store is not None:
                # A node joins before READY (a registration: its heartbeats claim the work after).
                self.leases = await join(s.store, rt, engine, s.cluster)
            await self._become_ready(rt)
            # The goals' pending decisions, then the turns that were waiting when the process
            # stopped, run now, after READY: readiness waits on neither the number of goals nor
            # any backlog.
            if s.store is None:
                rt.spawn(self._resume(rt, engine))
            services = await self._start_ready_services(rt)
            try:
                await self._stop.wait()
            finally:
                self._set_state(RunState.STOPPING)
                # First: a work-directory walk (a goal's idle, a goal/create in flight) ends now, and
                # nothing of the shutdown waits for one (goals.measure.Fingerprinter).
                engine.fingerprinter.stop()
                self._notifier.stopping()
                services.stop_first()
                disk_watch.cancel()
                if stdio_task is not None:
                    stdio_task.cancel()
                if page is not None:
                    await _step("the status page", page.stop())
                await _step("the control socket", server.stop())
                if self.scheduler is not None:
                    await _step("the scheduler", self.scheduler.stop())
                await _step("the goal engine", engine.stop())
                await _step("the services", services.stop_last())
                if self.sandboxing.proxy is not None:  # every command has ended: nothing goes out now
                    await _step("the network proxy", self.sandboxing.proxy.stop())
                if self.leases is not None:
                    await _step("the drivers", self.leases.halt())
        logger.debug("daemon stopping: the store closed")
        if self.leases is not None:
            await self.leases.stop()  # the drivers have stopped: the other nodes take over at once
        self._set_state(RunState.STOPPED)
        return 0

    def _before_store(self) -> int | None:
        """The start-up checks before the store opens (:mod:`daemon.startup`), the sandbox profile and
        the signal handlers; returns the control socket's group id."""
        s = self.settings
        # A group that does not exist refuses to start (exit 78) before the store opens.
        group = socket_group_id(s)
        raise_nofile_limit()
        prepare_work_roots(s)
        # An invalid goals file refuses to start (GoalsFileError, exit 78) before the store opens.
        check_goals_file(s, self)
        self._notifier = Notifier.from_env()
        self.sandboxing = sandbox_profile(s)
        self._install_signals(asyncio.get_running_loop())
        self.workdirs.owner = self.sandboxing.user
        return group

    async def _start_engine(self, rt: Runtime) -> GoalEngine:
        """The goal engine, listening, its live goals not loaded yet (they load after READY)."""
        s = self.settings
        engine = GoalEngine(
            rt,
            allowed_roots=s.roots,
            model_check=self._check_model,
            runner=sandboxed_runner(self.sandboxing.sandbox, self.sandboxing.redactor),
            runner_for=self._goal_runner,
            fingerprint_limits=FingerprintLimits(
                max_bytes=s.fingerprint_max_bytes, max_seconds=s.fingerprint_max_seconds
            ),
            disk_limit_for=lambda goal: goal_disk_limit(s, goal),
            hold=self.disk.low,
            reminders=Reminders(every=s.notify.question_repeat_seconds, most=s.notify.question_repeat_max),
            snapshots=Snapshots(s.snapshots_dir),
        )
        self.engine = engine
        # Before the engine resumes any goal's session (their tools are set up as they load).
        await self._learn_live_goal_secrets(rt)
        commit_on_completion(engine, rt.spawn)
        await engine.start(defer=True)
        return engine

    async def _become_ready(self, rt: Runtime) -> None:
        """Serving: ``READY=1`` with the live goals counted in one indexed read."""
        self._set_state(RunState.SERVING)
        self.ready.set()
        live = await rt.store.read(goal_counts)
        self._notifier.ready(self.status_line(live=live["active"] + live["paused"] + live["waiting"]))

    async def _start_ready_services(self, rt: Runtime) -> ReadyServices:
        """The watchdog, retention, metrics and notifications (:mod:`daemon.ready_services`)."""
        self.metrics = MetricsService(
            Metrics(
                rt.store,
                healths=self.healths,
                slots=self._slots,
                lag=LoopLag(),
                cluster=self.leases.nodes if self.leases is not None else None,
            ),
            self.settings.metrics,
        )
        return await ReadyServices.start(
            rt,
            self.settings,
            notifier=self._notifier,
            status=self.status_line,
            metrics=self.metrics,
            alerts=self.alerts,
            healthy=self._healthy,
            leases=self.leases,
        )

    async def _start_web(self, dispatcher: Any, rt: Runtime, sockets: list[Any]) -> Any:
        """The status page (``[web]``) on its bound sockets, through the same dispatcher as the
        control socket; ``None`` when it is off."""
        if not sockets:
            return None
        # Imported here: a daemon without the page never loads its HTTP server.
        from daemon.web.app import WebService

        service = WebService(self, dispatcher, self.settings.web, sockets)
        await service.start(rt.spawn)
        return service

    def _healthy(self) -> bool:
        """Serving, and the store writes (what the dead-man request vouches for)."""
        return self.state is RunState.SERVING and (self.rt is None or bool(self.rt.store.storage_health()["ok"]))

    async def _resume(self, rt: Runtime, engine: GoalEngine) -> None:
        await engine.follow_live_goals(decide=self.settings.resume_on_start)
        count = await rt.resume()
        if count:
            logger.info("resumed {} session(s) with queued work", count)

    async def _stdio(self, serve: Callable[..., Any], dispatcher: Any) -> None:
        try:
            await serve(dispatcher, self.settings.max_frame_bytes)
        finally:
            # stdin closed: the client is gone, and with it the reason to run. The same when stdin/stdout
            # cannot be served at all (e.g. stdout is a regular file): before, the daemon went on without them.
            self.request_stop()

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, lambda: self._spawn_reload())
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGUSR1, dump_tasks)

    def _spawn_reload(self) -> None:
        if self.rt is not None:
            self.rt.spawn(self._reload_quietly())

    async def _reload_quietly(self) -> None:
        # systemd's reload protocol: RELOADING=1 as it begins, READY=1 when done (the outcome in STATUS=).
        self._notifier.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")
        try:
            done = await self.reload()
        except Exception as exc:  # logged by reload(); the daemon keeps serving what it had
            self._notifier.ready(f"reload failed: {exc}")
            return
        self._notifier.ready(f"reloaded {done['goals']} goal(s), {done['schedules']} schedule(s); {self.status_line()}")

    async def reload(self) -> dict[str, int]:
        """Reload declared goals and schedules from the goals file, by key.

        Raises:
            GoalsFileError: the file is invalid (named in the message); nothing was changed.
        """
        fresh = self._note_config_changes()
        if fresh is not None and fresh.goals_file != self.settings.goals_file:
            # goals_file is the one setting a reload applies: one added, moved or removed is taken.
            logger.info("reload: goals_file is now {} (was {})", fresh.goals_file, self.settings.goals_file)
            self.settings = self.settings.model_copy(update={"goals_file": fresh.goals_file})
        if self.settings.goals_file is None or self.engine is None:
            logger.info("reload: done; no goals_file is configured, so no goal or schedule was applied")
            return {"goals": 0, "schedules": 0}
        try:
            done = await apply_declared(self, self.settings.goals_file)
            logger.info(
                "reload: applied {}: {} goal(s), {} schedule(s)",
                self.settings.goals_file,
                done["goals"],
                done["schedules"],
            )
            return done
        except GoalsFileError as exc:
            logger.error("reload refused, nothing was changed: {}", exc)
            raise
        except Exception:
            logger.exception("reloading {} failed; entries applied before the failure stay", self.settings.goals_file)
            raise

    def _note_config_changes(self) -> Settings | None:
        """Say which changes of the configuration file a reload does not apply (they need a
        restart), and remember added providers so that their models are refused as such. The
        file's settings as read now (``None``: no file, or an invalid one)."""
        path = self.settings.config_file
        if path is None:
            return None
        try:
            fresh = load_settings(path)
        except ConfigError as exc:
            logger.warning("reload: the configuration file is invalid now; a restart would refuse it: {}", exc)
            return None
        old, new = self.settings.providers, fresh.providers
        self.added_providers = {name: str(path) for name in new if name not in old}
        changed = [
            key
            for key in type(self.settings).model_fields
            if key not in ("goals_file",) and getattr(fresh, key) != getattr(self.settings, key)
        ]
        if changed:
            logger.warning(
                "reload: {} changed ({}): a reload applies only the goals file; these need a restart",
                path,
                ", ".join(changed),
            )
        return fresh

    async def _start_scheduler(self) -> None:
        assert self.rt is not None and self.engine is not None
        firing = GoalFiring(self.engine, self.workdirs, self.settings.default_model, self.learn_secrets)
        scheduler = Scheduler(
            self.rt.store, fire=firing.fire, goal_status=firing.goal_status, cancel_goal=firing.cancel_goal
        )
        self.scheduler = scheduler
        await scheduler.start()
        if self.settings.goals_file is not None:
            try:
                await self.reload()
            except Exception:
                await scheduler.stop()
                raise
