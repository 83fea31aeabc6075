"""Limits per goal: a cap on the processes and the memory of all of a goal's commands together.

Why cgroups. A command is many processes (bash, its pipelines, whatever they fork), and the daemon
often runs as root. As root ``RLIMIT_NPROC`` does not bind at all (65 processes were started under
``ulimit -u 20``, also with bwrap's ``--uid 1000``), and ``RLIMIT_AS`` binds each process, not the
command: twenty processes under a 1 GiB cap may take 20 GiB. A cgroup counts every process in it
together, and its limits bind root as well.

Why per goal. A model's step may ask for many tool calls at once, and they run in parallel: with
a group per command, one step of 24 shell calls held 2,574 MiB against a 256 MiB cap, and 64 calls
under the defaults could have held 256 GiB and 32,768 processes. So the caps bind the goal as a
whole: each goal (or session without a goal: the key is the goal's id, else the session's) has a
group with its caps (``sandbox_max_processes`` / ``sandbox_max_memory_mb``, or the goal's own
``max_processes`` / ``max_memory_mb``), and every command of it (shell calls, parallel ones
included, and its verification and ``progress`` commands) runs in a child group of it without
caps of its own: the child only tells which command a limit hit. The goal's group is made by its
first command (:meth:`Limiter.hold`, or :meth:`Limiter.group` with ``goal``) and removed with its
last, so it is gone when the goal ends, its session is dropped or the daemon stops. A command of
no goal (an MCP server, which serves every session; a notification command) has a group of its
own with the caps for itself. How many calls of a step run at once is capped too
(``max_parallel_tools``, :mod:`agent.toolcalls`); the goal's caps hold whatever that is.

* **cgroup v2, where it is delegated to us** (systemd's ``Delegate=yes``): our own group must let
  us enable ``pids`` and ``memory`` for children. A v2 group that has children with controllers may
  hold no process itself, so the daemon first moves itself into a leaf ``goald-daemon`` beside the
  goals' groups (what systemd asks of delegated subtrees), and a goal's group holds only its
  commands' groups (it enables ``pids`` and ``memory`` for them). Limits, on the goal's group:
  ``pids.max``, ``memory.max`` (and ``memory.swap.max = 0``, so a hog cannot escape into swap);
  verdicts: the command's ``memory.events`` (``oom_kill`` of its processes) and ``pids.events``
  (where the kernel counts a refused fork in the forking group; since Linux 6.12 it counts it in
  the goal's group, so a rise there while the command ran is its verdict too).
* **cgroup v1** otherwise, when the ``pids`` and ``memory`` hierarchies are mounted and our own
  group in each is writable: the same layout in each hierarchy, ``pids.max`` and
  ``memory.limit_in_bytes`` (and ``memsw`` when swap is accounted) on the goal's group; verdicts:
  the command's ``pids.events`` and ``memory.oom_control``'s ``oom_kill``.
* **rlimits** when neither is writable, said once in a warning at start: ``RLIMIT_AS`` on each
  process (the memory cap), ``RLIMIT_NPROC`` only when not root (it counts every process of the
  daemon's user, so it is set to that count plus the cap). These are per command, never per goal
  (the warning says so): parallel calls each get the goal's caps. A hit limit is not explained.

How a command enters its group before it runs anything. On cgroup v1 (:attr:`Limiter.enters_itself`)
the command's first process is a ``/bin/sh`` that writes ``0`` into each controller's ``tasks`` file
of its group (:meth:`Group.entry_files`; a process moving itself there takes no threadgroup lock,
where moving another process costs an RCU grace period, about 5 ms per controller), exits 70 if it
cannot (the command is then refused, plainly, and nothing of it ran), and only then execs (setpriv
and) bwrap. The shell is started first and reads those files on its standard input: the daemon
makes the group while the shell starts, so neither waits for the other. Otherwise bwrap is started
with ``--args FD`` on a pipe whose write end the daemon still holds. bwrap reads its arguments before it does anything
else, so it waits there; the daemon writes bwrap's PID into the group (or sets its rlimits with
``prlimit``), then writes the arguments (the secrets, or nothing) and closes the pipe. Everything
bwrap starts inherits the group. No ``preexec_fn`` (unsafe in a threaded process), and nothing
that needs ``clone3(CLONE_INTO_CGROUP)``, which Python does not offer. A long-running command
started by a spawner that hands us no PID before it runs (an MCP server, through the SDK) is
started by a launching bash of the daemon's own (:meth:`Group.entry_script`): it writes its own
PID into the group (or sets its rlimits) and only then execs bwrap, or exits 70; nothing of
the server runs before that, so it is as early as the daemon writing the PID itself.

After the command (once its PID namespace is empty, see :mod:`agent.sandbox`) the verdict is read
— ``process limit of the goal (N, all its commands together) reached`` or ``memory limit of the
goal (X MiB, all its commands together) exceeded: the kernel killed N processes of this command``
(``process limit (N) reached`` / ``memory limit (X MiB) exceeded`` for a command of no goal); for a
command that failed with nothing of it killed while the cap was met (the kernel killed processes
of the goal's other commands, or counted refused charges: v1's ``memory.failcnt``, v2's
``memory.events`` ``max``), ``memory limit of the goal (...) reached while this
command ran: it may have been refused memory``, since a system call refused memory (bwrap's
``Creating new namespace failed: Cannot allocate memory``, a fork) says nothing of the cap — and
the command's group is removed (then the goal's, after its last command). Groups left by a daemon
that was killed are removed when the next daemon detects its mechanism (their names carry the PID
of the daemon that made them), after the processes still in them are killed (a bwrap whose daemon
died before its ``--die-with-parent`` was armed, and all it started).

The package: :mod:`~agent.limits.base` (the caps, the :class:`GoalGroup`, :class:`Group` and
:class:`Limiter` interface), :mod:`~agent.limits.cgroup` (v2 and v1 groups),
:mod:`~agent.limits.rlimit` (the fallback), :mod:`~agent.limits.detect` (mount detection and
:func:`limiter`). Every name callers use is importable from ``agent.limits`` itself.
"""

from agent.limits.base import (
    MIB,
    MIN_MEMORY_BYTES,
    MIN_PROCESSES,
    CommandLimits,
    GoalGroup,
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
    "GoalGroup",
    "Group",
    "Limiter",
    "LimitsUnavailable",
    "Mechanism",
    "limiter",
]
