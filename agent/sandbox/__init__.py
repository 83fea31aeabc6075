"""The sandbox every tool command runs in: bubblewrap, or nothing when the config says so.

A :class:`Sandbox` is a small value: the work directory (the only writable place besides a private
``/tmp``), extra read-only paths (a toolchain), the paths to hide (the state directory, the
database, the control socket, the credentials, other work directories), the network (off, an
allow list through the daemon's proxy, or the host's), the environment, secrets included, and caps
on processes and memory (:class:`~agent.limits.CommandLimits`): a goal's, binding all its commands
together when the sandbox names the goal (``limits_group``: they share its cgroup), else the
command's own.
:meth:`Sandbox.argv` is the bubblewrap command line; :meth:`Sandbox.run` runs a command and returns
its exit code, both output streams and the limit it hit, if any.

**The daemon reads a work directory as data, never as configuration.** A work directory belongs
to the model: nothing in it (a ``.git/config`` with an fsmonitor or a pager, hooks, attributes, an
rc file, a ``.env``) may decide what the daemon runs outside the sandbox. Whatever executes on a
goal's behalf runs through a :class:`Sandbox`; the daemon itself only lists, stats and reads files
there.

The package, one module per concern (every public name is re-exported here, so callers import
from ``agent.sandbox`` or ``agent``):

* :mod:`~agent.sandbox.base` — :class:`SandboxUnavailable`, :class:`SandboxResult`, the fixed
  environment (``PATH`` and the variables no one may replace).
* :mod:`~agent.sandbox.command` — :class:`Sandbox`, the value, and the bubblewrap command line it
  builds (namespaces, the allowlisted mounts of :mod:`agent.allowlist`, environment, secrets
  through a pipe, the launcher for spawners that pass no descriptor).
* :mod:`~agent.sandbox.process` — running one command: starting bwrap under its limits
  (:mod:`agent.limits`), the timeout, killing every process of the command, the result.
* :mod:`~agent.sandbox.capture` — reading both output streams as they come and keeping their
  head and tail, secrets redacted.
* :mod:`~agent.sandbox.seccomp` — the system-call filter every command runs under.
* :mod:`~agent.sandbox.identity` — the unprivileged user a root daemon's commands run as.
* :mod:`~agent.sandbox.census` — what a sandboxed command holds, written down once, and the probe
  that reads it from inside a real sandbox.
* :mod:`~agent.sandbox.network` — the three network settings (:class:`Network`: ``off``, an allow
  list, ``host``), how names match and merge, which addresses the proxy refuses.
* :mod:`~agent.sandbox.proxy` — the daemon's HTTP proxy (:class:`NetworkProxy`), the one way out of
  a sandbox with an allow list: a unix socket per command, every attempt reported.
* :mod:`~agent.sandbox.bridge` — the bridge inside such a sandbox: ``127.0.0.1:3128`` to that socket,
  started before the command.
* :mod:`~agent.sandbox.profile` — what a daemon decides once (:class:`SandboxProfile`, the
  detected :class:`Bwrap`) and per goal (:class:`SandboxPolicy`).
"""

from agent.sandbox.base import BASE_VARIABLES, DEFAULT_PATH, SandboxResult, SandboxUnavailable
from agent.sandbox.command import Sandbox
from agent.sandbox.identity import SandboxUser, sandbox_user
from agent.sandbox.network import Network, NetworkAllow, NetworkSetting
from agent.sandbox.profile import Bwrap, SandboxPolicy, SandboxProfile, detect_bwrap
from agent.sandbox.proxy import Attempt, NetworkProxy, Omitted

__all__ = [
    "BASE_VARIABLES",
    "DEFAULT_PATH",
    "Attempt",
    "Bwrap",
    "Network",
    "NetworkAllow",
    "NetworkProxy",
    "NetworkSetting",
    "Omitted",
    "Sandbox",
    "SandboxPolicy",
    "SandboxProfile",
    "SandboxResult",
    "SandboxUnavailable",
    "SandboxUser",
    "detect_bwrap",
    "sandbox_user",
]
