"""Limits per sandboxed command: a cap on its processes and its memory, for the command as a whole.

Why cgroups. A command is many processes (bash, its pipelines, whatever they fork), and the daemon
often runs as root. As root ``RLIMIT_NPROC`` does not bind at all (65 processes were started under
``ulimit -u 20``, also with bwrap's ``--uid 1000``), and ``RLIMIT_AS`` binds each process, not the
command: twenty processes under a 1 GiB cap may take 20 GiB. A cgroup counts every process of the
command together, and its limits bind root as well. So each command gets a cgroup of its own:

* **cgroup v2, where it is delegated to us** (systemd's ``Delegate=yes``): our own group must let
  us enable ``pids`` and ``memory`` for children. A v2 group that has children with controllers may
  hold no process itself, so the daemon first moves itself into a leaf ``goald-daemon`` beside the
  command groups (what systemd asks of delegated subtrees). Limits: ``pids.max``, ``memory.max``
  (and ``memory.swap.max = 0``, so a hog cannot escape into swap); verdicts: ``pids.events`` and
  ``memory.events``.
* **cgroup v1** otherwise, when the ``pids`` and ``memory`` hierarchies are mounted and our own
  group in each is writable: ``pids.max``, ``memory.limit_in_bytes`` (and ``memsw`` when swap is
  accounted); verdicts: ``pids.events`` and ``memory.oom_control``'s ``oom_kill``.
* **rlimits** when neither is writable, said once in a warning at start: ``RLIMIT_AS`` on each
  process (the memory cap), ``RLIMIT_NPROC`` only when not root (it counts every process of the
  daemon's user, so it is set to that count plus the cap). A hit limit is then not explained.

How a command enters its group before it runs anything: bwrap is started with ``--args FD`` on a
pipe whose write end the daemon still holds. bwrap reads its arguments before it does anything
else, so it waits there; the daemon writes bwrap's PID into the group (or sets its rlimits with
``prlimit``), then writes the arguments (the secrets, or nothing) and closes the pipe. Everything
bwrap starts inherits the group. No ``preexec_fn`` (unsafe in a threaded process), and nothing
that needs ``clone3(CLONE_INTO_CGROUP)``, which Python does not offer. A long-running command
started by a spawner that hands us no PID before it runs (an MCP server, through the SDK) is
started by a launching bash of the daemon's own (:meth:`Group.entry_script`): it writes its own
PID into the group (or sets its rlimits) and only then execs bwrap, or exits 70; nothing of
the server runs before that, so it is as early as the daemon writing the PID itself.

After the command (once its PID namespace is empty, see :mod:`agent.sandbox`) the verdict is read
— ``process limit (N) reached`` or ``memory limit (X MiB) exceeded`` — and the group is removed.
Groups left by a daemon that was killed are removed when the next daemon detects its mechanism
(their names carry the PID of the daemon that made them).

The package: :mod:`~agent.limits.base` (the caps, the :class:`Group` and :class:`Limiter`
interface), :mod:`~agent.limits.cgroup` (v2 and v1 groups), :mod:`~agent.limits.rlimit` (the
fallback), :mod:`~agent.limits.detect` (mount detection and :func:`limiter`). Every name callers
use is importable from ``agent.limits`` itself.
"""

from agent.limits.base import (
    MIB,
    MIN_MEMORY_BYTES,
    MIN_PROCESSES,
    CommandLimits,
    Group,
    Limiter,
    LimitsUnavailable,
    Mechanism,
)
from agent.limits.detect import limiter

__all__ = [
    "MIB",
    "MIN_MEMORY_BYTES",
    "MIN_PROCESSES",
    "CommandLimits",
    "Group",
    "Limiter",
    "LimitsUnavailable",
    "Mechanism",
    "limiter",
]
