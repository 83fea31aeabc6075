"""The daemon's network proxy: the one way out of a sandbox whose network is an allow list.

A command whose network is ``{allow = [...]}`` (:mod:`agent.sandbox.network`) has a network
namespace of its own, with only a loopback. The daemon runs one :class:`NetworkProxy`; each such
command gets a :class:`ProxyGate`: a unix socket of its own (``0600``), made when the command
starts (:meth:`ProxyGate.hold`) and removed when it ends, with that command's allow list and where
its attempts are reported. The sockets live in ``goald-proxy-<pid>-*`` under the temporary
directory (never seen by a sandbox, whose ``/tmp`` is its own), which only the daemon (and, for a
root daemon, the sandbox user, to bind a socket: search only) may enter; it is made at the first
such command and removed when the daemon stops (a killed daemon's, at the next start of one). The
socket is bound into the sandbox (:data:`agent.sandbox.bridge.SOCKET`),
where a bridge makes it ``127.0.0.1:3128`` (:mod:`agent.sandbox.bridge`).

The proxy speaks HTTP/1.x as a forward proxy (:mod:`agent.sandbox.proxywire`):

* ``CONNECT host:port`` (HTTPS, or any TCP through a tunnel): answered ``200`` and then spliced
  byte for byte; the TLS inside is the command's business end to end (no interception).
* ``GET http://host[:port]/path`` and the other methods with an absolute URI (plain HTTP): one
  request per connection, sent on in origin form with ``Host`` set from the URI (a different
  ``Host`` header cannot reach another site on the same address), the ``Proxy-*`` headers dropped,
  ``Connection: close``.

A connection goes through only when the requested name is in the allow list
(:meth:`~agent.sandbox.network.Network.allows`); then the proxy resolves the name itself and
connects only to its public addresses (:func:`~agent.sandbox.network.refused_address`: a listed
name that resolves to ``127.0.0.1``, ``10.0.0.5`` or ``169.254.169.254`` is refused; the address
connected to is the one checked, so DNS rebinding between the check and the connection is not
possible). ``hosts`` (a mapping of names to addresses) is the one exception: what it names is the
operator's (or a test's) explicit word, trusted as written. Every attempt -- let through, refused,
failed -- is reported to the gate's callback as an :class:`Attempt` (the daemon writes each as a
``sandbox/network`` event of the session); past :attr:`NetworkProxy.max_reports` attempts of one
command, the rest are counted, and reported once, as :class:`Omitted`, when the command ends.

Bounds: at most :attr:`NetworkProxy.max_connections` connections at once over all commands and
:attr:`NetworkProxy.max_per_gate` for one command (more are answered ``503`` and reported); a
request's head must come within :attr:`NetworkProxy.header_timeout` seconds and fit in 64 KiB; a
connection quiet both ways for :attr:`NetworkProxy.idle_timeout` seconds is closed; connecting
gives up after :attr:`NetworkProxy.connect_timeout` seconds; everything of a command is closed
when the command ends, and everything when :meth:`NetworkProxy.stop` is called (the daemon's stop).

Known limit: a listed name shares its addresses with whatever else is served there (a CDN's other
sites, through the TLS name the command sends inside ``CONNECT``); the proxy checks names and
addresses, not what is said inside the tunnel.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from agent.sandbox.base import SandboxUnavailable
from agent.sandbox.network import Network, refused_address
from agent.sandbox.proxywire import CHUNK, MAX_HEAD, Refused, parse_head, reply, splice

_BUSY = "too many connections through the proxy at once"
#: Connections over the bounds answered ``503`` at once; past this many, closed unanswered.
_MAX_REFUSING = 16

#: Looks a name up: ``(name, port) -> addresses``.
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


@dataclass(frozen=True)
class Attempt:
    """One connection a sandboxed command asked the proxy for, and what became of it."""

    host: str
    port: int
    #: ``CONNECT``, or the plain HTTP request's method.
    method: str
    #: Whether the proxy connected it.
    allowed: bool
    #: Why not (refused or failed); ``None`` when allowed.
    reason: str | None = None
    #: The address connected to, or the one refused.
    address: str | None = None


@dataclass(frozen=True)
class Omitted:
    """Attempts of one command past the reporting bound, counted, not reported one by one."""

    count: int


#: Where a gate reports: each :class:`Attempt`, and once at its end an :class:`Omitted` if any.
Report = Callable[[Attempt | Omitted], None]


async def system_resolver(host: str, port: int) -> list[str]:
    """The system's resolver (``getaddrinfo``): the name's addresses, each once, in its order."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _log_report(item: Attempt | Omitted) -> None:
    if isinstance(item, Omitted):
        logger.info("sandbox network: {} more attempts not recorded one by one", item.count)
    elif item.allowed:
        logger.info("sandbox network: {} {}:{} let through ({})", item.method, item.host, item.port, item.address)
    else:
        logger.info("sandbox network: {} {}:{} refused: {}", item.method, item.host, item.port, item.reason)


class NetworkProxy:
    """The daemon's forward proxy for sandboxes with an allow list (see the module docstring).

    Made once per daemon; nothing listens until a command with an allow list runs
    (:meth:`gate`, :meth:`ProxyGate.hold`). ``owner``: ``(uid, gid)`` of the sandbox user when the
    daemon is root (bwrap, as that user, binds the socket: the directory is ``0710`` to its group,
    each socket its own). ``directory``: where the sockets' directory is made (default: the
    system's temporary directory; the name must stay short, a unix socket's path is at most 107
    bytes).
    """

    def __init__(
        self,
        *,
        resolver: Resolver | None = None,
        hosts: Mapping[str, Sequence[str]] | None = None,
        owner: tuple[int, int] | None = None,
        directory: Path | None = None,
        max_connections: int = 256,
        max_per_gate: int = 64,
        idle_timeout: float = 300.0,
        connect_timeout: float = 10.0,
        header_timeout: float = 30.0,
        max_reports: int = 200,
    ) -> None:
        self.resolver: Resolver = resolver or system_resolver
        self.hosts = {name.lower().removesuffix("."): list(addrs) for name, addrs in (hosts or {}).items()}
        self.owner = owner
        self.base = directory
        self.max_connections = max_connections
        self.max_per_gate = max_per_gate
        self.idle_timeout = idle_timeout
        self.connect_timeout = connect_timeout
        self.header_timeout = header_timeout
        self.max_reports = max_reports
        self._dir: Path | None = None
        self._gates: set[ProxyGate] = set()
        self._active = 0
        self._stopped = False

    @property
    def active(self) -> int:
        """Connections open now, over all commands."""
        return self._active

    @property
    def directory(self) -> Path:
        """The sockets' directory, made on first use."""
        if self._dir is None:
            if self._stopped:
                raise SandboxUnavailable("the daemon's network proxy has stopped")
            _clean_stale(Path(self.base or tempfile.gettempdir()))
            made = Path(tempfile.mkdtemp(prefix=f"goald-proxy-{os.getpid()}-", dir=self.base))
            if self.owner is not None:
                os.chown(made, 0 if os.geteuid() == 0 else -1, self.owner[1])
                made.chmod(0o710)
            self._dir = made
        return self._dir

    def gate(self, network: Network, report: Report | None = None) -> ProxyGate:
        """The gate of one command whose network is ``network`` (an allow list), reporting to
        ``report`` (default: the daemon's log). Nothing listens until :meth:`ProxyGate.hold`."""
        if not network.proxied:
            raise ValueError(f"network {network.describe()!r} takes no proxy")
        return ProxyGate(self, network, report or _log_report)

    async def stop(self) -> None:
        """Close every gate and connection and remove the sockets' directory (idempotent)."""
        self._stopped = True
        for gate in list(self._gates):
            await gate._close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    async def resolve(self, host: str, port: int) -> list[str]:
        """The addresses the proxy may connect ``host`` to, or :class:`Refused` saying why none."""
        name = host.lower().removesuffix(".")
        if name in self.hosts:
            return list(self.hosts[name])  # the operator's (a test's) explicit word: trusted
        with contextlib.suppress(ValueError):
            literal = str(ipaddress.ip_address(name))  # an address as written: checked, never looked up
            why = refused_address(literal)
            if why is not None:
                raise Refused(403, f"{host} resolves to no public address ({why})", address=literal)
            return [literal]
        try:
            async with asyncio.timeout(self.connect_timeout):
                found = list(await self.resolver(name, port))
        except (OSError, TimeoutError) as exc:
            why = getattr(exc, "strerror", None) or str(exc) or "timed out"
            raise Refused(502, f"cannot resolve {host}: {why}") from None
        if not found:
            raise Refused(502, f"cannot resolve {host}: no address")
        public = [a for a in found if refused_address(a) is None]
        if not public:
            why = refused_address(found[0])
            raise Refused(403, f"{host} resolves to no public address ({why})", address=found[0])
        return public


def _clean_stale(base: Path) -> None:
    """Remove the sockets' directories of this user's daemons that are gone (killed: a stopped
    daemon removes its own), ``goald-proxy-<pid>-*`` of a process that no longer exists."""
    for found in base.glob("goald-proxy-*-*"):
        pid = found.name.split("-")[2]
        try:
            if not pid.isdigit() or found.stat().st_uid != os.geteuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(found, ignore_errors=True)
        except OSError:
            continue


class ProxyGate:
    """One command's way out: its own socket, its allow list, where its attempts go."""

    def __init__(self, proxy: NetworkProxy, network: Network, report: Report) -> None:
        self.proxy = proxy
        self.network = network
        self._report = report
        self.name = f"{secrets.token_hex(8)}.sock"
        self._server: asyncio.Server | None = None
        self._holders = 0
        self._tasks: set[asyncio.Task[None]] = set()
        #: Connections being served (the others in ``_tasks`` are being answered ``503``).
        self._serving = 0
        self._reported = 0
        self._omitted = 0

    @property
    def path(self) -> Path:
        """The socket's path on the host (bound into the sandbox)."""
        return self.proxy.directory / self.name

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[Path]:
        """Listen while the block runs (several holders share one listener; the last one out closes
        it, its connections and its socket file); yields the socket's path.

        Raises:
            SandboxUnavailable: the socket cannot be made (the proxy stopped, no directory).
        """
        if self._holders == 0:
            await self._open()
        self._holders += 1
        try:
            yield self.path
        finally:
            self._holders -= 1
            if self._holders == 0:
                await self._close()

    async def _open(self) -> None:
        path = self.path
        try:
            self._server = await asyncio.start_unix_server(self._accept, path=str(path), limit=MAX_HEAD)
            if self.proxy.owner is not None:
                os.chown(path, *self.proxy.owner)
            path.chmod(0o600)
        except OSError as exc:
            await self._close()
            raise SandboxUnavailable(f"the network proxy cannot listen at {path}: {exc.strerror or exc}") from None
        self.proxy._gates.add(self)

    async def _close(self) -> None:
        self.proxy._gates.discard(self)
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if server is not None:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        if self.proxy._dir is not None:
            with contextlib.suppress(OSError):
                (self.proxy._dir / self.name).unlink()
        if self._omitted:
            omitted, self._omitted = self._omitted, 0
            self._emit(Omitted(omitted))

    def _emit(self, item: Attempt | Omitted) -> None:
        try:
            self._report(item)
        except Exception:
            logger.exception("reporting a sandbox's network attempt failed")

    def _record(self, attempt: Attempt) -> None:
        if self._reported >= self.proxy.max_reports:
            self._omitted += 1
            return
        self._reported += 1
        self._emit(attempt)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The server's callback: serve the connection in a task of the gate's own (closed with it),
        or answer ``503`` past the bounds."""
        proxy = self.proxy
        if proxy.active >= proxy.max_connections or self._serving >= proxy.max_per_gate:
            self._record(Attempt("", 0, "", False, _BUSY))
            if len(self._tasks) - self._serving >= _MAX_REFUSING:  # refusals in flight: drop the rest unanswered
                writer.close()
                return
            self._spawn(reply(reader, writer, 503, _BUSY))
            return
        self._serving += 1
        proxy._active += 1
        self._spawn(self._serve(reader, writer))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handle(reader, writer)
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            self._serving -= 1
            self.proxy._active -= 1
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self.proxy.header_timeout):
                head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.LimitOverrunError, ValueError):
            await reply(reader, writer, 431, "the request's head is over 64 KiB")
            return
        try:
            method, host, port, forward = parse_head(head)
        except Refused as exc:
            self._record(Attempt("", 0, "", False, exc.reason))
            await reply(reader, writer, exc.status, exc.reason)
            return
        try:
            upstream, address = await self._connect(host, port)
        except Refused as exc:
            self._record(Attempt(host, port, method, False, exc.reason, exc.address))
            await reply(reader, writer, exc.status, exc.reason)
            return
        up_reader, up_writer = upstream
        self._record(Attempt(host, port, method, True, None, address))
        try:
            if forward is None:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                up_writer.write(forward)
            await splice(reader, writer, up_reader, up_writer, self.proxy.idle_timeout)
        finally:
            up_writer.close()

    async def _connect(self, host: str, port: int) -> tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter], str]:
        if not self.network.allows(host):
            listed = ", ".join(self.network.allow) or "no name"
            raise Refused(403, f"{host} is not in the sandbox's network allow list ({listed})")
        addresses = await self.proxy.resolve(host, port)
        failures: list[str] = []
        for address in addresses:
            try:
                async with asyncio.timeout(self.proxy.connect_timeout):
                    return await asyncio.open_connection(address, port, limit=CHUNK), address
            except (OSError, TimeoutError) as exc:
                failures.append(f"{address}: {getattr(exc, 'strerror', None) or 'timed out'}")
        raise Refused(502, f"cannot connect to {host}:{port} ({'; '.join(failures)})", address=addresses[0])
