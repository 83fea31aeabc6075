"""The host's start-up checks: what refuses a start, run before the store opens.

Each refusal is one line and exit 78 (:class:`~daemon.settings.ConfigError`,
:class:`~daemon.checks.StateDirUnusable`, :class:`~daemon.declared.GoalsFileError`), never a
traceback and exit 1, which systemd would restart for ever. A directory one of them creates (the
state directory, a work-directory root) is said in the log, so that a typo in the configuration
does not become a new directory nobody looks in.
"""

from __future__ import annotations

from pathlib import Path

from loguru import logger

from daemon.checks import StateDirUnusable, socket_gid, state_dir_problem
from daemon.config_check import config_findings
from daemon.declared import check_declared
from daemon.ports import HostPort
from daemon.rpc.protocol import Dispatcher
from daemon.rpc.server import ConnectionLimits, UnixServer
from daemon.settings import ConfigError, Settings


def prepare_state_dir(state_dir: Path) -> None:
    """Refuse an unusable state directory (creating it when missing, which is logged).

    Raises:
        StateDirUnusable: the directory cannot be made or written; the message says why.
    """
    existed = state_dir.is_dir()
    problem = state_dir_problem(state_dir)
    if problem is not None:
        raise StateDirUnusable(problem)
    if not existed:
        logger.info("created the state directory {}", state_dir)


def socket_group_id(settings: Settings) -> int | None:
    """The control socket's group id (``socket_group``), or ``None`` for the daemon's user only.

    Raises:
        ConfigError: the group does not exist.
    """
    return socket_gid(settings.socket_group) if settings.socket_group is not None else None


def prepare_work_roots(settings: Settings) -> None:
    """Create the work-directory roots that do not exist yet (0700), saying so."""
    for root in settings.roots:
        if not root.is_dir():
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
            # Said out loud: a typo in workdir_roots would otherwise become a new directory unseen.
            log = logger.warning if settings.workdir_roots else logger.info
            log("created the work-directory root {} (workdir_roots): it did not exist", root)


def check_goals_file(settings: Settings, host: HostPort) -> None:
    """Check the goals file (if any) as a reload would, and log its warnings.

    Raises:
        GoalsFileError: the file is invalid (its entry and field named); nothing was written.
    """
    if settings.goals_file is None:
        return
    declared = check_declared(settings.goals_file, host)
    for finding in config_findings(settings, host.models, declared):
        if finding.key.startswith("goals file"):
            logger.warning("configuration: {}", finding)


async def start_control_socket(settings: Settings, dispatcher: Dispatcher, group: int | None) -> UnixServer:
    """Listen on the control socket (owned by ``group`` when one is given).

    Raises:
        ConfigError: the socket cannot be given to ``group`` (the daemon's user is not a member).
    """
    s = settings
    server = UnixServer(s.socket_path, dispatcher, s.max_frame_bytes, limits=ConnectionLimits.of(s), group=group)
    try:
        await server.start()
    except PermissionError as exc:
        raise ConfigError(
            f"socket_group {s.socket_group!r}: cannot give {s.socket_path} to that group ({exc.strerror});"
            " the daemon's user must be a member of it"
        ) from None
    return server
