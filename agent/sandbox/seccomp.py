"""The sandbox's system-call filter: what no sandboxed command may ask of the kernel, whatever it is.

Namespaces, the mount allowlist, the unprivileged uid and the dropped capabilities already keep a
command from most of the host; the filter is the layer under them, so that one mistake in those is
not an escape (Codex's Linux sandbox and Claude Code's sandbox runtime add one to their namespaces
for the same reason). It is built once per process with libseccomp (through ``pyseccomp``, its
ctypes binding; hand-assembled BPF would be ours to get right for every architecture) and handed
to bwrap as compiled BPF on a pipe (``--seccomp FD``); bwrap sets ``no_new_privs`` and loads it
just before it execs the command, and every process of the command inherits it.

What it stops, and how:

* **Killed** (the process dies of ``SIGSYS``; the tool result then says the sandbox stopped it,
  :data:`VIOLATION`): setting the set-user-ID or set-group-ID bit (``chmod``, ``fchmod``,
  ``fchmodat``, ``fchmodat2``, and ``open``/``openat``/``creat``/``mknod``/``mknodat`` creating a
  file with one), the kernel keyrings (``keyctl``, ``add_key``, ``request_key``), ``ptrace`` and
  reading or writing another process's memory, mounting (``mount``, ``umount2``, ``pivot_root``,
  the new mount API), new namespaces (``unshare``, ``setns``, ``clone`` with any ``CLONE_NEW*``
  flag), ``bpf``, kernel modules, ``kexec``, ``reboot``, swap, ``acct``, the clock, ``quotactl``,
  ``open_by_handle_at`` (the classic container escape), ``ioperm``/``iopl``, ``syslog``,
  ``chroot``, and the terminal injection ioctls
  (``TIOCSTI``, ``TIOCLINUX``).
* **Refused with ENOSYS** (the C library then falls back to an older call the filter can read):
  ``clone3`` (its flags are in memory a filter cannot inspect) and ``openat2`` (its mode likewise).
* **Refused with EPERM** (probed by ordinary runtimes, which cope): ``perf_event_open``,
  ``userfaultfd``.

Everything else is allowed. Another architecture's system calls (32-bit ``int 0x80`` on x86-64)
are killed: libseccomp's default for a foreign architecture.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
import tempfile
from typing import Any

from agent.sandbox.base import SandboxUnavailable

#: What a tool result says when a process of the command was killed by the filter.
VIOLATION = (
    "the sandbox stopped a process of this command: it made a system call no sandboxed command may make "
    "(set-user-ID or set-group-ID bits, the kernel keyring, ptrace, mounts, new namespaces, bpf, kernel "
    "modules and the like; see the README's sandbox section)"
)
#: The exit code of a command whose main process the filter killed (128 + SIGSYS).
SIGSYS_EXIT = 128 + 31
#: What bash prints when a process it started died of ``SIGSYS``.
SHELL_SAYS = b"Bad system call"

_SUID_BITS = (stat.S_ISUID, stat.S_ISGID)
#: Syscall -> (index of its flags argument or None, index of its mode argument): creating or changing a
#: file with a set-id bit is killed. With a flags argument, only a call that creates (``O_CREAT`` or
#: ``O_TMPFILE``) is looked at: without them the mode is not an argument at all.
_MODE_ARG: dict[str, tuple[int | None, int]] = {
    "chmod": (None, 1),
    "fchmod": (None, 1),
    "fchmodat": (None, 2),
    "fchmodat2": (None, 2),
    "creat": (None, 1),
    "mknod": (None, 1),
    "mknodat": (None, 2),
    "open": (1, 2),
    "openat": (2, 3),
}
_CREATING = (os.O_CREAT, 0o20000000)  # O_CREAT, __O_TMPFILE
_KILLED = (
    "keyctl",
    "add_key",
    "request_key",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "bpf",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "quotactl",
    "quotactl_fd",
    "open_by_handle_at",
    "name_to_handle_at",
    "ioperm",
    "iopl",
    "syslog",
    "chroot",
    "lookup_dcookie",
    "nfsservctl",
    "uselib",
    "vhangup",
)
_ENOSYS = ("clone3", "openat2")
_EPERM = ("perf_event_open", "userfaultfd")
#: Every CLONE_NEW* flag (mount, cgroup, uts, ipc, user, pid, net, time): a clone making any is killed.
_CLONE_NEW = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080)
_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C


def _filter() -> Any:
    try:
        import pyseccomp as sc  # type: ignore[import-untyped]
    except (ImportError, OSError) as exc:  # libseccomp missing: no sandbox without its filter
        raise SandboxUnavailable(f"the seccomp filter cannot be built: {exc}") from None
    f = sc.SyscallFilter(sc.ALLOW)
    kill = sc.KILL_PROCESS

    def add(action: Any, name: str, *args: Any) -> None:
        if sc.resolve_syscall(sc.system_arch(), name) < 0:
            return  # a system call this libseccomp does not know on this architecture: nothing to refuse
        f.add_rule(action, name, *args)

    for name, (flags, mode) in _MODE_ARG.items():
        for bit in _SUID_BITS:
            if flags is None:
                add(kill, name, sc.Arg(mode, sc.MASKED_EQ, bit, bit))
            else:
                for creating in _CREATING:
                    add(
                        kill,
                        name,
                        sc.Arg(flags, sc.MASKED_EQ, creating, creating),
                        sc.Arg(mode, sc.MASKED_EQ, bit, bit),
                    )
    for name in _KILLED:
        add(kill, name)
    for name in _ENOSYS:
        add(sc.ERRNO(errno.ENOSYS), name)
    for name in _EPERM:
        add(sc.ERRNO(errno.EPERM), name)
    for flag in _CLONE_NEW:
        add(kill, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for request in (_TIOCSTI, _TIOCLINUX):
        add(kill, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    return f


@functools.lru_cache(maxsize=1)
def program() -> bytes:
    """The compiled filter (BPF for this machine's architecture), built once per process.

    Raises:
        SandboxUnavailable: libseccomp is missing or refused the filter.
    """
    f = _filter()
    try:
        with tempfile.TemporaryFile() as fh:
            f.export_bpf(fh)
            fh.seek(0)
            data = fh.read()
    except OSError as exc:
        raise SandboxUnavailable(f"the seccomp filter cannot be built: {exc}") from None
    if not data or len(data) % 8:
        raise SandboxUnavailable("the seccomp filter compiled to nothing usable")
    return data
