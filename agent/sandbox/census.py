"""What a sandboxed command holds, written down once: the census, and the probe that takes it.

The sandbox is defended in layers (namespaces, the mount allowlist, an unprivileged uid, no
capabilities, ``no_new_privs``, the system-call filter, cgroups). Attacks found one at a time are
each one more thing someone thought of; the census is the other way round: it lists *everything*
a command holds, and a test compares it, whole, with :func:`expected` for every kind of command
(shell, verification, progress, MCP server, notification) and every sandbox setting. A new
descriptor, mount, capability, namespace or variable fails it, whatever attack would have used it.

:data:`PROBE` is a Python program run inside the sandbox (``python3 -I -S -c PROBE [targets]``);
it prints one JSON object, :func:`census` of what it saw:

* ``fds``: the open descriptors (0, 1, 2 only);
* ``mounts``: every mount point, and those without ``nosuid`` or ``nodev`` (the device nodes of
  ``/dev`` excepted: a device node works only where devices are allowed);
* ``uid``/``gid`` inside, and ``groups``, the supplementary ones (none for a root daemon's
  commands); who the command is on the host is read outside, from the owner of a file it made
  (:func:`owner`): never root, the sandbox user for a root daemon, the daemon's own user otherwise;
* ``caps``: every capability set, all empty; ``no_new_privs`` 1; ``seccomp`` 2 (a filter);
* ``keys``: the keys ``/proc/keys`` shows (none: it is covered), and ``forbidden``: what became of a
  child that tried a forbidden call (``keyctl``, a set-user-ID ``chmod``, a user namespace, ``mount``,
  ``ptrace``): ``killed`` each;
* ``cgroup``: whether the command is in a group of goald's (when caps are set);
* ``interfaces``: the network interfaces (``lo`` only, unless the network is the host's);
* ``namespaces``: each namespace's inode, compared outside with the daemon's own: user, mount, PID,
  UTS, IPC and network of its own (the network the daemon's with ``host``), the cgroup and time
  namespaces the daemon's (:data:`SHARED_NAMESPACES`);
* ``answered``: which of the host endpoints given as arguments (``tcp:HOST:PORT``, ``abstract:NAME``)
  accepted a connection (none);
* ``env``: the environment's names.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agent.sandbox.command import Sandbox

#: Mount points whose device nodes must work: ``nodev`` is not expected there.
DEVICE_MOUNTS = frozenset(
    {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/pts"}
)
#: Mounts bwrap itself may add, depending on the host (parts of ``/proc`` it makes read-only).
BWRAP_MOUNTS = frozenset({"/", "/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", *DEVICE_MOUNTS})

PROBE = r"""
import ctypes, json, os, platform, socket, sys
out = {}
out["fds"] = sorted(int(n) for n in os.listdir("/proc/self/fd"))
# the listing's own descriptor is gone by now; anything above 2 is held
out["fds"] = [fd for fd in out["fds"] if fd <= 2 or os.path.exists("/proc/self/fd/%d" % fd)]
points, nosuid, nodev = [], [], []
for line in open("/proc/self/mountinfo"):
    left = line.split(" - ")[0].split()
    point, opts = left[4].replace("\\040", " "), set(left[5].split(","))
    points.append(point)
    if "nosuid" not in opts:
        nosuid.append(point)
    if "nodev" not in opts:
        nodev.append(point)
out["mounts"] = sorted(set(points))
out["without_nosuid"] = sorted(set(nosuid))
out["without_nodev"] = sorted(set(nodev))
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
out["uid"] = int(status["Uid"].split()[0]); out["gid"] = int(status["Gid"].split()[0])
out["groups"] = sorted(set(os.getgroups()) - {out["gid"]})
open("census-owner", "w").close()  # its owner on the host is read outside (owner())
out["caps"] = {k: int(status[k].strip(), 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
out["no_new_privs"] = int(status["NoNewPrivs"]); out["seccomp"] = int(status["Seccomp"])
try:
    out["keys"] = [l.split()[-2] for l in open("/proc/keys") if l.strip()]
except OSError:
    out["keys"] = []
libc = ctypes.CDLL(None, use_errno=True)
nr = {"x86_64": {"keyctl": 250, "ptrace": 101}, "aarch64": {"keyctl": 219, "ptrace": 117}}.get(platform.machine(), {})
def fate(fn):
    pid = os.fork()
    if pid == 0:
        try:
            r = fn()
            os._exit(0 if r == 0 else 3)
        except BaseException:
            os._exit(4)
    _, st = os.waitpid(pid, 0)
    if os.WIFSIGNALED(st):
        return "killed" if os.WTERMSIG(st) == 31 else "signal %d" % os.WTERMSIG(st)
    return {0: "allowed", 3: "refused", 4: "refused"}.get(os.WEXITSTATUS(st), "exit %d" % os.WEXITSTATUS(st))
def suid():
    open("probe-suid", "w").close()
    try:
        return libc.chmod(b"probe-suid", 0o4755)
    finally:
        os.unlink("probe-suid")
out["forbidden"] = {
    "keyctl": fate(lambda: libc.syscall(nr["keyctl"], 0, -3, 0)) if nr else "unknown",
    "setuid_chmod": fate(suid),
    "user_namespace": fate(lambda: libc.unshare(0x10000000)),
    "mount": fate(lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
    "ptrace": fate(lambda: libc.syscall(nr["ptrace"], 0, 0, 0, 0)) if nr else "unknown",
}
out["cgroup"] = sorted(l.strip().split(":", 2)[2] for l in open("/proc/self/cgroup") if "goald-" in l)
out["interfaces"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:])
out["namespaces"] = {n: os.stat("/proc/self/ns/" + n).st_ino for n in sorted(os.listdir("/proc/self/ns"))}
answered = []
for target in sys.argv[1:]:
    kind, _, where = target.partition(":")
    try:
        if kind == "tcp":
            host, _, port = where.rpartition(":")
            s = socket.create_connection((host, int(port)), timeout=2)
        else:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(2); s.connect("\0" + where)
        s.close(); answered.append(target)
    except OSError:
        pass
out["answered"] = answered
out["env"] = sorted(os.environ)
print("CENSUS " + json.dumps(out, sort_keys=True))
"""


def command(targets: list[str] | None = None) -> list[str]:
    """The probe's command line (``targets``: host endpoints to try, see the module docstring)."""
    return ["python3", "-I", "-S", "-c", PROBE, *(targets or [])]


def owner(workdir: Path) -> tuple[int, int]:
    """Who the probe was on the host: the owner of the file it made in ``workdir`` (then removed)."""
    path = workdir / "census-owner"
    st = path.stat()
    path.unlink()
    return (st.st_uid, st.st_gid)


def host_identity(sandbox: Sandbox) -> tuple[int, int]:
    """Who a command of ``sandbox`` must be on the host."""
    return sandbox.run_as if sandbox.run_as is not None else (os.getuid(), os.getgid())


def parse(output: str) -> dict[str, Any]:
    """The census printed by :data:`PROBE` somewhere in ``output``.

    Raises:
        ValueError: there is none.
    """
    for line in output.splitlines():
        if line.startswith("CENSUS "):
            found: dict[str, Any] = json.loads(line[len("CENSUS ") :])
            return found
    raise ValueError(f"no census in the probe's output: {output[-2000:]!r}")


def expected(sandbox: Sandbox, *, grouped: bool, extra_env: tuple[str, ...] = ()) -> dict[str, Any]:
    """What a command in ``sandbox`` must hold, in :data:`PROBE`'s shape (``mounts`` as the set the
    allowlist makes; :func:`differences` allows bwrap's own host-dependent ones beside it).
    ``grouped``: whether its commands run in a cgroup of goald's (caps are set and enforced by
    cgroups here)."""
    host = sandbox.network
    uid, gid = host_identity(sandbox)
    return {
        "fds": [0, 1, 2],
        "mounts": sorted(_points(sandbox)),
        "without_nosuid": [],
        "without_nodev": sorted(DEVICE_MOUNTS),
        "uid": 0 if sandbox.run_as is None and os.getuid() == 0 else uid,
        "gid": 0 if sandbox.run_as is None and os.getgid() == 0 else gid,
        # A root daemon's commands hold no supplementary group; a daemon of its own user keeps its
        # groups (an unprivileged bwrap cannot drop them), shown as the overflow group.
        "groups": [] if sandbox.run_as is not None else "host",
        "caps": dict.fromkeys(("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"), 0),
        "no_new_privs": 1,
        "seccomp": 2,
        "keys": [],
        "forbidden": dict.fromkeys(("keyctl", "setuid_chmod", "user_namespace", "mount", "ptrace"), "killed"),
        "cgroup": "grouped" if grouped else [],
        "interfaces": "host" if host else ["lo"],
        "namespaces": _namespaces(sandbox),
        "answered": "host" if host else [],
        "env": sorted({*sandbox.environment(secrets=True), "PWD", *extra_env}),
    }


#: The namespaces a command shares with the daemon whatever its setting: the cgroup namespace
#: (refused under systemd's ``RestrictNamespaces=~cgroup``; the cgroup file system is not mounted
#: in the sandbox) and the time namespace (bwrap makes none).
SHARED_NAMESPACES = frozenset({"cgroup", "time", "time_for_children"})


def _namespaces(sandbox: Sandbox) -> dict[str, str]:
    """Which of the daemon's namespaces a command in ``sandbox`` must have of its own (``"own"``) and
    which it shares (``"daemon's"``), by name as ``/proc/self/ns`` lists them here."""
    shared = set(SHARED_NAMESPACES)
    if sandbox.network:
        shared.add("net")
    if not sandbox.unshare_ipc:
        shared.add("ipc")
    return {n: "daemon's" if n in shared else "own" for n in sorted(os.listdir("/proc/self/ns"))}


def _points(sandbox: Sandbox) -> set[str]:
    args = sandbox._mounts(None)
    points: set[str] = set()
    i = 0
    while i < len(args):
        op = args[i]
        if op in ("--proc", "--dev", "--tmpfs", "--remount-ro"):
            if op != "--remount-ro":
                points.add(args[i + 1])
            i += 2
        elif op == "--symlink":
            i += 3
        else:  # --bind, --ro-bind, --bind-fd: source, target
            points.add(args[i + 2])
            i += 3
    return points


def differences(seen: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """Each way ``seen`` departs from ``want``, in words; empty when the census holds."""
    found: list[str] = []
    for key, value in want.items():
        got = seen.get(key)
        if key == "mounts":
            extra = sorted(set(got or []) - set(value) - BWRAP_MOUNTS)
            missing = sorted(set(value) - set(got or []))
            if extra:
                found.append(f"mounts not in the census: {extra}")
            if missing:
                found.append(f"mounts missing: {missing}")
        elif key == "without_nodev":
            extra = sorted(set(got or []) - set(value))
            if extra:
                found.append(f"mounts without nodev: {extra}")
        elif key == "namespaces":
            mine = {n: os.stat(f"/proc/self/ns/{n}").st_ino for n in value}
            got_ns = {n: "daemon's" if ino == mine.get(n) else "own" for n, ino in (got or {}).items()}
            if got_ns != value:
                wrong = sorted(
                    f"{n} {got_ns.get(n, 'missing')}" for n in {*value, *got_ns} if got_ns.get(n) != value.get(n)
                )
                found.append(f"namespaces not as in the census: {', '.join(wrong)}")
        elif value == "grouped":
            if not got:
                found.append("the command is not in a cgroup of goald's")
        elif value == "host":
            continue
        elif got != value:
            found.append(f"{key}: {got!r}, expected {value!r}")
    return found
