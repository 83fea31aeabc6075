"""The tool interface and registry.

A tool is typed: its arguments are a pydantic model whose JSON schema is what the model sees, and
the registry validates a call's arguments before the tool runs. Every call has a timeout and an
output cap (longer output is cut with a clear marker), and each tool declares whether repeating it
is safe, which matters when a crash leaves a call's outcome unknown.
"""

from __future__ import annotations

import asyncio
import functools
import json
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from agent.errors import InvalidInput
from agent.models.base import ToolSpec
from agent.redact import Redactor
from agent.tools.policy import DENIED_PREFIX, Ask, ToolPolicy

if TYPE_CHECKING:
    from agent.spend import SpendGuard
    from agent.store import Store
    from agent.tx import Tx

#: The key of :attr:`ToolContext.extra` under which the runtime passes the session's spend guard.
GUARD_KEY = "guard"

A = TypeVar("A", bound=BaseModel)
T = TypeVar("T")


@dataclass
class ToolContext:
    """What a running tool may know of its call."""

    session_id: str
    turn_id: str
    call_id: str
    workdir: Path | None = None
    #: The store, for tools that record durable facts in their own transaction (:meth:`transact`).
    store: Store | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: The running driver's write (:meth:`agent.writer.DriverWriter.write`), when a driver runs the call.
    write: Callable[[Callable[[Tx], Any]], Awaitable[Any]] | None = None

    async def transact(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in a transaction on the call's session: the running driver's write when there is
        one — fenced by the session's lease, and after what the driver deferred, so the answer that
        asked for this call is durable before what the call records (:mod:`agent.step` defers an
        answer whose calls change nothing else: :attr:`Tool.effects_in_store`) —, else the store's."""
        if self.write is not None:
            result: T = await self.write(fn)
            return result
        if self.store is None:
            raise RuntimeError("a tool context without a store cannot write")
        return await self.store.transact(fn, session=self.session_id)

    async def settle(self) -> None:
        """Make what the driver deferred durable now (the answer that asked for this call): before
        someone is asked about the call, who must have heard of it first."""
        if self.write is not None:
            await self.write(_nothing)

    def time_left(self) -> float | None:
        """The seconds left before the session's spend guard's time runs out (its deadline or the end
        of its wall time; a goal's guard holds the earlier of the two as its deadline); ``None``
        without a guard or a time limit. A tool that waits caps its wait at this, so a command cannot
        outlive the time its session has (the guard binds model calls; tools bind their own waits)."""
        guard: SpendGuard | None = self.extra.get(GUARD_KEY)
        return guard.time_left() if guard is not None else None


def _nothing(tx: Tx) -> None:
    """A write of nothing (what was deferred goes with it: :meth:`ToolContext.settle`)."""


@dataclass
class ToolOutput:
    """A tool's result as the model will see it."""

    content: str
    is_error: bool = False
    #: Why the tool policy refused the call (it was not run); the driver records it as ``tool/denied``.
    denied: str | None = None


class Tool(ABC, Generic[A]):
    """A typed, async tool."""

    name: ClassVar[str]
    description: ClassVar[str]
    Args: type[A]
    timeout: float = 60.0
    output_cap: int = 64_000
    #: Whether running the call again after an unknown outcome is harmless.
    repeat_safe: bool = False
    #: Whether the call changes nothing outside goald's store, and what it changes there it changes
    #: through its context's transaction (:meth:`ToolContext.transact`): reading a file, listing a
    #: directory, a goal's note. Then the answer that asks for it need not be durable before it runs:
    #: it commits with that change, or with the driver's next write, never after any effect of the
    #: call (:mod:`agent.step`). A tool that writes a file, runs a command or calls out does not.
    effects_in_store: bool = False

    @abstractmethod
    async def run(self, args: A, ctx: ToolContext) -> ToolOutput | str:
        """Do the work."""

    def spec(self) -> ToolSpec:
        """The tool as offered to the model."""
        return ToolSpec(name=self.name, description=self.description, input_schema=_schema(self.Args))


class FunctionTool(Tool[A]):
    """A tool made from an async function of (args, ctx)."""

    def __init__(
        self,
        name: str,
        description: str,
        args: type[A],
        fn: Callable[[A, ToolContext], Awaitable[ToolOutput | str]],
        *,
        timeout: float = 60.0,
        output_cap: int = 64_000,
        repeat_safe: bool = False,
        effects_in_store: bool = False,
    ) -> None:
        self.name = name  # type: ignore[misc]
        self.description = description  # type: ignore[misc]
        self.Args = args
        self._fn = fn
        self.timeout = timeout
        self.output_cap = output_cap
        self.repeat_safe = repeat_safe
        self.effects_in_store = effects_in_store

    async def run(self, args: A, ctx: ToolContext) -> ToolOutput | str:
        return await self._fn(args, ctx)


@functools.cache
def _schema(args: type[BaseModel]) -> dict[str, Any]:
    # Building a JSON schema costs milliseconds; every session of a daemon offers the same tools.
    return args.model_json_schema()


def truncate(text: str, cap: int) -> str:
    """Cut ``text`` to ``cap`` characters with a marker saying how much was left out."""
    if len(text) <= cap:
        return text
    keep = max(0, cap - 80)
    return text[:keep] + f"\n[... output truncated: {len(text) - keep} of {len(text)} characters not shown ...]"


#: Decides a call the policy asks about: ``None`` to run it, or the output the model gets instead.
Approver = Callable[[Ask, "ToolContext"], Awaitable["ToolOutput | None"]]


class ToolRegistry:
    """The tools one session may use, by name, under an optional :class:`ToolPolicy`."""

    def __init__(
        self,
        tools: list[Tool[Any]] | None = None,
        *,
        policy: ToolPolicy | None = None,
        redactor: Redactor | None = None,
        unavailable: Mapping[str, str] | None = None,
        approver: Approver | None = None,
    ) -> None:
        self._tools: dict[str, Tool[Any]] = {}
        #: Who decides a call the policy asks about (:class:`~agent.tools.policy.Ask`): ``None`` to
        #: run it, or the output the model gets instead. Without one such a call is denied.
        self.approver = approver
        #: Secret values replaced in every result before it is stored or shown.
        self.redactor = redactor
        #: Tools not offered here, by name, with the reason a call to one is answered with.
        self.unavailable = dict(unavailable or {})
        self._specs: list[ToolSpec] | None = None
        self._specs_bytes: int | None = None
        self._policy = policy
        for tool in tools or []:
            self.add(tool)

    @property
    def policy(self) -> ToolPolicy | None:
        """What may run; ``None`` allows everything."""
        return self._policy

    @policy.setter
    def policy(self, policy: ToolPolicy | None) -> None:
        self._policy = policy
        self._specs = None
        self._specs_bytes = None

    def add(self, tool: Tool[Any]) -> None:
        """Register a tool (names are unique)."""
        if tool.name in self._tools:
            raise InvalidInput(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        self._specs = None
        self._specs_bytes = None

    def get(self, name: str) -> Tool[Any] | None:
        """The tool called ``name``, if any."""
        return self._tools.get(name)

    def effects_in_store(self, names: Iterable[str]) -> bool:
        """Whether calls of these names change nothing but through their context's transaction: each
        runs a tool that declares so (:attr:`Tool.effects_in_store`), or nothing at all (a name with
        no tool here is answered with an error)."""
        return all((tool := self._tools.get(name)) is None or tool.effects_in_store for name in names)

    @property
    def names(self) -> list[str]:
        """Registered tool names."""
        return list(self._tools)

    def specs(self) -> list[ToolSpec]:
        """The spec of every tool the policy allows by name, computed once."""
        if self._specs is None:
            policy = self._policy
            self._specs = [t.spec() for t in self._tools.values() if policy is None or policy.allows_tool(t.name)]
        return self._specs

    def specs_bytes(self) -> int:
        """Size of the tool specs as sent to a model."""
        if self._specs_bytes is None:
            self._specs_bytes = len(json.dumps([s.model_dump() for s in self.specs()]))
        return self._specs_bytes

    async def call(self, name: str, raw_args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """Check the policy, validate and run one call (timeout, output cap). Never raises for tool faults."""
        if self._policy is not None:
            denied = self._policy.check(name, raw_args)
            ask = self._policy.asks(name, raw_args, denied) if self._policy.ask or self._policy.shell_ask else None
            if ask is not None and self.approver is not None:
                instead = await self.approver(ask, ctx)
                if instead is not None:
                    return ToolOutput(self._redact(instead.content), instead.is_error)
                denied = None  # approved: it runs
            elif ask is not None:
                denied = f"{ask.reason}; the policy asks an operator about it, and nobody can be asked here"
            if denied is not None:
                denied = self._redact(denied)  # it quotes the command, which may carry a secret
                return ToolOutput(DENIED_PREFIX + denied, True, denied=denied)
        tool = self._tools.get(name)
        if tool is None and name in self.unavailable:
            return ToolOutput(f"the tool {name!r} is not available here: {self.unavailable[name]}", True)
        if tool is None:
            return ToolOutput(f"unknown tool {name!r}; available: {', '.join(self._tools) or 'none'}", True)
        try:
            args = tool.Args.model_validate(raw_args)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
            )
            return ToolOutput(f"invalid arguments for {name}: {problems}", True)
        try:
            async with asyncio.timeout(tool.timeout):
                out = await tool.run(args, ctx)
        except TimeoutError:
            return ToolOutput(f"{name} timed out after {tool.timeout:g}s", True)
        except Exception as exc:
            return ToolOutput(self._redact(f"{name} failed: {type(exc).__name__}: {exc}"), True)
        if isinstance(out, str):
            out = ToolOutput(out)
        return ToolOutput(truncate(self._redact(out.content), tool.output_cap), out.is_error)

    def _redact(self, text: str) -> str:
        # Before truncation: a cut must not leave half a secret that no longer matches.
        return self.redactor.redact(text) if self.redactor is not None else text
