"""Shared fixtures and the suite-wide guard against reaching anything beyond this machine."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time
from freezegun.api import FrozenDateTimeFactory
from pydantic import BaseModel

from agent import FunctionTool, ModelRegistry, Runtime, ScriptedModel, ToolContext, ToolRegistry

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


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any test that would reach a real provider (anything but loopback or a unix socket)."""
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)
    monkeypatch.setattr(socket.socket, "connect_ex", _guarded_connect_ex)
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A fresh SQLite file path in the test's temp dir."""
    return tmp_path / "goald.db"


class NoArgs(BaseModel):
    """No arguments."""


async def _noop(args: NoArgs, ctx: ToolContext) -> str:
    return "ok"


def noop_tool(name: str = "noop") -> FunctionTool[NoArgs]:
    """A tool that does nothing and answers ``ok``."""
    return FunctionTool(name, "does nothing", NoArgs, _noop, repeat_safe=True)


@pytest.fixture
def open_runtime(db_path: Path) -> Callable[..., AbstractAsyncContextManager[Runtime]]:
    """``async with open_runtime(model, tools=[...]) as rt``: a runtime on the test's database.

    ``model`` (a :class:`ScriptedModel`) is registered as the default model.
    """

    def opener(
        model: ScriptedModel | None = None,
        *,
        tools: list[Any] | None = None,
        path: Path | None = None,
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


#: The instant :func:`frozen_clock` starts at (a fixed past instant, so runs are repeatable).
FROZEN_AT = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)


@pytest.fixture
def frozen_clock() -> Iterator[FrozenDateTimeFactory]:
    """Wall-clock time (``datetime.now``, ``time.time``) frozen at :data:`FROZEN_AT`.

    asyncio's own clock keeps running (``real_asyncio=True``), so timeouts, ``asyncio.sleep`` and a
    scripted model's ``delay=`` behave as usual. Move the frozen time with ``frozen_clock.move_to(...)``
    or ``frozen_clock.tick(seconds)``.
    """
    with freeze_time(FROZEN_AT, real_asyncio=True) as frozen:
        assert isinstance(frozen, FrozenDateTimeFactory)
        yield frozen
