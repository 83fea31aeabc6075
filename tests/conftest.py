"""Shared fixtures and the suite-wide guard against reaching anything beyond this machine."""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from pgkit import NO_POSTGRES, PgServer, dbname_of
from pydantic import BaseModel

from agent import FunctionTool, ModelRegistry, Runtime, ScriptedModel, Store, ToolContext, ToolRegistry

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _allowed(address: Any) -> bool:
    if isinstance(address, (str, bytes)):  # unix socket path
        return True
    host = address[0]
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _guarded_connect(self: socket.socket, address: Any) -> Any:
    if not _allowed(address):
        raise RuntimeError(f"test tried to reach {address!r}: only loopback and unix sockets are allowed")
    return _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> Any:
    if not _allowed(address):
        raise RuntimeError(f"test tried to reach {address!r}: only loopback and unix sockets are allowed")
    return _real_connect_ex(self, address)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs_bwrap: needs bubblewrap able to make a sandbox here (skipped otherwise)")
    config.addinivalue_line("markers", "e2e: starts the real daemon or other processes (every test under tests/e2e/)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "e2e" in item.path.parts[-2:-1]:
            item.add_marker(pytest.mark.e2e)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("needs_bwrap") is not None:
        from sandboxkit import NO_BWRAP

        if NO_BWRAP is not None:
            pytest.skip(f"bubblewrap cannot make a sandbox here: {NO_BWRAP}")


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any test that would reach a real provider (anything but loopback or a unix socket)."""
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", _guarded_connect_ex)
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(autouse=True)
def _sandbox_user_passes(request: pytest.FixtureRequest) -> None:
    """As root, a daemon's sandboxed commands run as the sandbox user, and bwrap (as that user) must
    pass through a work directory's parents to bind it (agent.sandbox.identity): pytest makes its
    temporary directories 0700, so a test's own are opened for passage (search only, no listing)."""
    if os.geteuid() != 0 or "tmp_path" not in request.fixturenames:
        return
    path: Path = request.getfixturevalue("tmp_path")
    for part in (path, *list(path.parents)[:2]):
        if part.stat().st_mode & 0o001 == 0:
            part.chmod(part.stat().st_mode | 0o011)


@pytest.fixture
def outside() -> Iterator[Path]:
    """A fresh directory outside ``/tmp`` (removed afterwards): the sandbox gives commands a private
    ``/tmp``, so what a test must show them (or hide from them) lives here."""
    base = Path("/var/tmp")
    if not base.is_dir() or not os.access(base, os.W_OK):
        pytest.skip("needs a writable /var/tmp (a directory outside /tmp)")
    path = Path(tempfile.mkdtemp(prefix="goald-test-", dir=base)).resolve()
    if os.geteuid() == 0:
        path.chmod(0o711)  # the sandbox user passes through to a work directory made here
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """One real PostgreSQL server for the whole session (started at first use; skips, saying why,
    where PostgreSQL is not installed)."""
    if NO_POSTGRES is not None:
        pytest.skip(f"PostgreSQL is not available: {NO_POSTGRES}")
    server = PgServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_dsn(pg_server: PgServer) -> Iterator[str]:
    """The DSN of a fresh, empty database of the session's server, dropped after the test."""
    dsn = pg_server.create_database()
    try:
        yield dsn
    finally:
        pg_server.drop_database(dbname_of(dsn))


STORES = ("sqlite", "postgresql")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test (or module, or class) marked ``both_stores`` runs once per store: ``db_path`` is
    parametrized over :data:`STORES`."""
    if "db_path" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_stores") is not None:
        metafunc.parametrize("db_path", STORES, ids=STORES, indirect=True)


@pytest.fixture
def db_path(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """A fresh store: a SQLite file path in the test's temp dir; under ``both_stores``, for the
    ``postgresql`` parameter, the DSN of a fresh PostgreSQL database (:func:`pg_dsn`)."""
    store = getattr(request, "param", "sqlite")
    if store == "postgresql":
        if NO_POSTGRES is not None:
            pytest.skip(f"PostgreSQL is not available: {NO_POSTGRES}")
        dsn: str = request.getfixturevalue("pg_dsn")
        return dsn
    return tmp_path / "goald.db"


@pytest.fixture
async def store(db_path: Path | str) -> AsyncIterator[Store]:
    """A store opened on ``db_path`` and closed after the test (a PostgreSQL-only module gives
    ``db_path`` as its ``pg_dsn``)."""
    opened = await Store.open(db_path)
    try:
        yield opened
    finally:
        await opened.close()


class NoArgs(BaseModel):
    """No arguments."""


async def _noop(args: NoArgs, ctx: ToolContext) -> str:
    return "ok"


def noop_tool(name: str = "noop") -> FunctionTool[NoArgs]:
    """A tool that does nothing and answers ``ok``."""
    return FunctionTool(name, "does nothing", NoArgs, _noop, repeat_safe=True)


@pytest.fixture
def open_runtime(db_path: Path | str) -> Callable[..., AbstractAsyncContextManager[Runtime]]:
    """``async with open_runtime(model, tools=[...]) as rt``: a runtime on the test's database.

    ``model`` (a :class:`ScriptedModel`) is registered as the default model.
    """

    def opener(
        model: ScriptedModel | None = None,
        *,
        tools: list[Any] | None = None,
        path: Path | str | None = None,
        **kw: Any,
    ) -> AbstractAsyncContextManager[Runtime]:
        registry = ModelRegistry()
        if model is not None:
            registry.add(model)
            registry.default = model.spec
        tool_list = tools if tools is not None else [noop_tool()]
        return Runtime.open(path or db_path, models=registry, tools=lambda row: ToolRegistry(list(tool_list)), **kw)

    return opener


async def collect(it: AsyncIterator[Any], n: int) -> list[Any]:
    """The first ``n`` items of an async iterator."""
    out = []
    async for item in it:
        out.append(item)
        if len(out) >= n:
            break
    return out
