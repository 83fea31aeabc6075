"""What every part of the sandbox shares: its error, its result, and the fixed environment."""

from __future__ import annotations

from dataclasses import dataclass

from agent.errors import AgentError

#: The sandbox's ``PATH``.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Variables every sandbox sets; extra variables and secrets may not replace them.
BASE_VARIABLES = frozenset({"PATH", "HOME", "LANG", "TMPDIR"})


class SandboxUnavailable(AgentError, RuntimeError):
    """A command cannot run in a sandbox here (bwrap is missing, or the work directory is unusable)."""


class CommandRefused(SandboxUnavailable):
    """A command is not started, for a reason of the host that passes (the disk holding the store is
    nearly full); the message says why, and a tool's result reads ``not run: <message>``."""


@dataclass(frozen=True)
class SandboxResult:
    """What a command did."""

    #: Its exit code (``128 + N`` when signal N ended it); ``None`` when it timed out.
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    seconds: float = 0.0
    #: Bytes each stream produced, shown or not.
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    #: The limit the command hit, in words (``"process limit (64) reached: ..."``); ``None`` if none.
    limit: str | None = None

    @property
    def ok(self) -> bool:
        """Exit code 0 within the timeout."""
        return self.exit_code == 0 and not self.timed_out
