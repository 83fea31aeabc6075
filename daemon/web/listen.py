"""The status page's listening sockets, bound before the store opens.

Binding first means a port in use, or a socket path that cannot be made, stops the daemon at
start with one line naming ``[web]`` (exit 78, like any invalid configuration) before anything
is opened or repaired, rather than as a failure deep in a running daemon. The server
(:mod:`daemon.web.app`) serves on these sockets once the daemon is ready.
"""

from __future__ import annotations

import contextlib
import os
import socket

from daemon.metrics_service import split_listen
from daemon.settings import ConfigError
from daemon.web.settings import WebSettings


def bind_listeners(web: WebSettings) -> list[socket.socket]:
    """The bound sockets of ``[web]`` (TCP ``listen`` and/or the unix ``socket``).

    Raises:
        ConfigError: an address or path cannot be bound (the key, the value and the reason).
    """
    bound: list[socket.socket] = []
    try:
        if web.listen is not None:
            host, port = split_listen(web.listen)
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
                family, kind, proto, _, addr = infos[0]
                sock = socket.socket(family, kind, proto)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                bound.append(sock)
                sock.bind(addr)
                sock.listen(128)
            except OSError as exc:
                raise ConfigError(f"web.listen {web.listen!r}: cannot listen there: {exc.strerror or exc}") from None
        if web.socket is not None:
            path = web.socket.expanduser()
            try:
                if path.is_socket():
                    path.unlink()
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                bound.append(sock)
                old = os.umask(0o177)  # 0600: the operator's proxy runs as the daemon's user, or is given it
                try:
                    sock.bind(str(path))
                finally:
                    os.umask(old)
                sock.listen(128)
            except OSError as exc:
                raise ConfigError(f"web.socket {str(path)!r}: cannot listen there: {exc.strerror or exc}") from None
    except BaseException:
        for s in bound:
            with contextlib.suppress(OSError):
                s.close()
        raise
    for s in bound:
        s.setblocking(False)
    return bound


def describe(sock: socket.socket) -> str:
    """Where ``sock`` listens (``http://127.0.0.1:8470`` or ``unix:/run/goald/web.sock``)."""
    name = sock.getsockname()
    if sock.family == socket.AF_UNIX:
        return f"unix:{name}"
    host, port = name[0], name[1]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
