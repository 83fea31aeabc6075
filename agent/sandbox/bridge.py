"""The bridge inside a sandbox whose network is an allow list: ``127.0.0.1:3128`` to the daemon's proxy.

A sandbox with an allow list has a network namespace of its own (only a loopback), and one way
out: the unix socket of the daemon's proxy (:mod:`agent.sandbox.proxy`), bound read-only at
:data:`SOCKET` (a unix socket is reached by its file, whatever the namespace). Programs speak to
an HTTP proxy over TCP, so a small bridge listens on :data:`HOST`:\\ :data:`PORT` in the
sandbox's own namespace and forwards each connection, byte for byte, to that socket; it knows
nothing of HTTP (the proxy decides everything). The command gets ``HTTP_PROXY``, ``HTTPS_PROXY``,
``ALL_PROXY`` (and their lower-case forms) pointing at it, and an empty ``NO_PROXY``.

How it starts (:func:`wrap`): the sandboxed command line becomes ``python3 -I -S -c BRIDGE
SOCKET PORT cmd...``. The program binds and listens *before* the command exists (no race: the
first connection the command makes is accepted), then starts the command (``posix_spawnp``: no
copy of the interpreter's memory) and stays as its parent, relaying connections in threads and
waiting for it: its exit is the command's (its code, or ``128 + N`` for signal N, as bwrap itself
reports a signal), so the sandbox ends when the command does, and the kernel then kills every
process of its PID namespace. The command gets SIGPIPE and SIGXFSZ at their defaults (Python
ignores both), holds no descriptor of the bridge's (its sockets are close-on-exec), and has its
streams to itself: the bridge points its own at ``/dev/null``. The bridge ignores SIGTERM,
SIGINT, SIGHUP and SIGQUIT, so a timeout's SIGTERM to every process of the sandbox reaches the
command without ending the sandbox before the command's grace is over, and a command that
signals its own process group does not cut its network. Its start costs one ``python3 -I -S``
start with only builtin modules imported (the ``socket`` module's own imports would double it),
a bind and a spawn: measured by ``benchmarks/bench_sandbox.py`` (the ``allow list`` row).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence

from agent.sandbox.base import DEFAULT_PATH, SandboxUnavailable

#: Where the proxy's socket is bound inside the sandbox.
SOCKET = "/run/goald/proxy.sock"
#: Where the bridge listens inside the sandbox (its own network namespace: no host port is used).
HOST = "127.0.0.1"
PORT = 3128

#: The bridge: argv is ``SOCKET PORT CMD...``. Only builtin modules: its start is every command's.
BRIDGE = r"""
import _socket as S, _signal as G, _thread, os, sys, time
path, port, cmd = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
ls = S.socket(S.AF_INET, S.SOCK_STREAM)
ls.setsockopt(S.SOL_SOCKET, S.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port))
ls.listen(128)
try:
    pid = os.posix_spawnp(cmd[0], cmd, os.environ, setsigdef=(G.SIGPIPE, G.SIGXFSZ))
except OSError as e:
    os.write(2, ("%s: %s\n" % (cmd[0], e.strerror)).encode(errors="replace"))
    os._exit(127 if isinstance(e, FileNotFoundError) else 126)
for sig in (G.SIGTERM, G.SIGINT, G.SIGHUP, G.SIGQUIT):
    G.signal(sig, G.SIG_IGN)
null = os.open("/dev/null", os.O_RDWR)
for n in (0, 1, 2):
    os.dup2(null, n)
os.close(null)

def pipe(src, dst, pair):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(S.SHUT_WR)
    except OSError:
        pass
    pair.append(src)
    if len(pair) == 4:
        for s in pair[:2]:
            s.close()

def serve():
    while True:
        try:
            fd, _ = ls._accept()
        except OSError:
            time.sleep(0.05)
            continue
        conn = S.socket(S.AF_INET, S.SOCK_STREAM, 0, fd)
        up = S.socket(S.AF_UNIX, S.SOCK_STREAM)
        try:
            up.connect(path)
        except OSError:
            conn.close()
            up.close()
            continue
        pair = [conn, up]
        try:
            _thread.start_new_thread(pipe, (conn, up, pair))
        except RuntimeError:  # no thread left (the goal's process cap)
            conn.close()
            up.close()
            continue
        try:
            _thread.start_new_thread(pipe, (up, conn, pair))
        except RuntimeError:
            pair.append(up)  # the first thread, ending, closes both
            conn.shutdown(S.SHUT_RDWR)

_thread.start_new_thread(serve, ())
_, status = os.waitpid(pid, 0)
code = os.waitstatus_to_exitcode(status)
os._exit(code if code >= 0 else 128 - code)
"""


def python() -> str:
    """The ``python3`` the bridge runs on: the first on the sandbox's fixed ``PATH`` (the system
    directories, shown read-only in every sandbox).

    Raises:
        SandboxUnavailable: there is none.
    """
    found = shutil.which("python3", path=DEFAULT_PATH)
    if found is None:
        raise SandboxUnavailable(
            f"a network allow list needs python3 on the sandbox's PATH ({DEFAULT_PATH}) for its proxy bridge"
        )
    return found


def wrap(cmd: Sequence[str], *, interpreter: str | None = None) -> list[str]:
    """``cmd`` started behind the bridge (see the module docstring)."""
    return [interpreter or python(), "-I", "-S", "-c", BRIDGE, SOCKET, str(PORT), *cmd]


def environment() -> dict[str, str]:
    """The variables that send a command's HTTP and HTTPS through the bridge."""
    url = f"http://{HOST}:{PORT}"
    names = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
    return {
        **{n: url for n in names},
        **{n.lower(): url for n in names},
        "NO_PROXY": "",
        "no_proxy": "",
    }
