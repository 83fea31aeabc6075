"""Invariant 11: no production code derives a follow-up's result by correlating ``MessageId`` with ``turn/end``.

A ``MessageId`` proves a message's receipt and its fate (admitted by turn T, or cancelled); it never
identifies the outcome of the work that follows. This consumer test reads every ``.py`` file of
``agent/``, ``goals/`` and ``daemon/`` with :mod:`ast` and fails on code that pairs the two.

The rule, per scope (a function, a class body, or a module's top level; nested functions are their
own scopes, lambdas and comprehensions belong to the enclosing one):

* A **message-id reference** is a name, attribute, keyword or string key spelled like a message id
  (``message_id``, ``messageId``, ``msg_id``, ``mid``, ``continuation_id``, ``MessageId`` …).
  A **turn/end reference** is ``EventType.TURN_END``, the string ``"turn/end"``, ``TurnEnd``,
  ``TurnEnded`` (its typed payload), ``EndReason``, or a name/attribute/key spelled
  ``end_reason``/``endReason`` (any prefix).
* Taint spreads through assignments: a variable assigned from an expression holding a reference of
  one kind carries that kind; so does a variable assigned a *read* value (a name, subscript or call,
  not a literal or an ``Enum.MEMBER``) inside a branch whose condition holds that kind (``if``,
  ``while``, ``for`` over a tainted iterable, ``match`` case pattern and guard). ``x[k] = v`` and
  ``x.append(v)``-style calls taint ``x``. Taint is computed to a fixed point, ignoring order.
* The scope **correlates** (and the test fails) when any of these holds:

  1. one condition (``if``/``while``/``elif``/``assert``/conditional expression/comprehension
     filter/``case`` pattern with its guard) holds both kinds: "the turn/end of my message";
  2. code in a branch selected by one kind refers to the other kind: "when the turn ends, look
     up the message", or "for my message, read how its turn ended";
  3. a record keys turn/end data by message: a dict display or comprehension with a message-id
     key and a turn/end value, a call with a message-id keyword and a turn/end argument, or
     ``results[<message id>] = <turn/end value>``;
  4. one SQL query (a string starting with ``SELECT``/``WITH``) reads both the inbox or a
     message id and ``end_reason``/``turn/end`` (the join from a message to its turn's end).

What stays legal: recording admission (the inbox writes ``turnId`` next to ``messageId``: that is a
fate, not a result), tracking a continuation's fate by its id, reading the last ``turn/end`` of an
owned interval as a run-level observation in code that does not touch the message id, and
formatting events one at a time. The ACP bridge is the one place the design lets map the turn
that admitted a prompt to a stop reason (invariant 8); when it is written, list its function in
:data:`ALLOWED` with that reason. Docstrings are prose and are not scanned.

The check reads one scope at a time: a helper that hides one side of the pairing behind a call
(``end_of(turn_of(mid))``) is beyond it and is left to review. Taint is deliberately not followed
through calls: the goal engine legitimately combines its continuation's fate with the interval's
last turn end in one decision, and call-level taint would flag that.

The self-tests below feed the checker offending and clean snippets, so it cannot silently pass
everything, and check that the production scan actually sees both kinds of reference.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "goals", "daemon")

#: ``module:qualname`` → why it may correlate (invariant 8 sanctions the ACP stop reason only).
ALLOWED: dict[str, str] = {
    # Invariant 8: an ACP prompt must report a stopReason, read from the turn that admitted its
    # message (an admission fact, within the interval the ACP prompt owns up to whole-agent idle).
    # This method is the only place that pairs the prompt's message id with that turn's turn/end;
    # the mapping to a stop reason lives in daemon.acp.prompt.stop_reason, which sees no message id.
    "daemon.acp.prompt:PromptSlot.observe": "invariant 8: the ACP stop reason of the admitting turn",
}

MID_NAME = re.compile(r"^(?:\w*_)?(?:message|msg)_?ids?$|^mids?$|^continuation_ids?$", re.IGNORECASE)
END_NAME = re.compile(r"^(?:\w*_)?end_?reasons?$|^turn_?end(?:ed)?$|^end_?reason$|^EndReason$", re.IGNORECASE)
END_STRINGS = {"turn/end"}
SQL_START = re.compile(r"^\s*(SELECT|WITH)\b", re.IGNORECASE)
SQL_MID = re.compile(r"\binbox\b|messageId|message_id", re.IGNORECASE)
SQL_END = re.compile(r"end_reason|turn/end", re.IGNORECASE)
MUTATORS = {"append", "add", "extend", "insert", "update", "setdefault", "appendleft", "put_nowait"}

MID, END = "message id", "turn/end"
KINDS = (MID, END)


@dataclass
class Finding:
    """One correlation the checker found."""

    where: str
    line: int
    rule: str

    def __str__(self) -> str:
        return f"{self.where} line {self.line}: {self.rule}"


@dataclass
class Taint:
    """Names (dotted, e.g. ``self._ends``) carrying each kind of reference."""

    names: dict[str, set[str]] = field(default_factory=lambda: {MID: set(), END: set()})


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base is not None else None
    return None


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under ``node`` except nested function and class bodies and docstring statements.

    The checker asks this of a node and again of each statement around it (hundreds of thousands of
    times over the production code); the trees are never changed, so each node keeps its answer."""
    walked: tuple[ast.AST, ...] | None = node.__dict__.get("_i11_walked")
    if walked is None:
        walked = tuple(_walk_once(node))
        node.__dict__["_i11_walked"] = walked
    return iter(walked)


def _walk_once(node: ast.AST) -> Iterator[ast.AST]:
    stack = [node]
    while stack:
        cur = stack.pop()
        yield cur
        for child in ast.iter_child_nodes(cur):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant):
                continue
            if isinstance(child, ast.arg):
                continue  # parameter names and annotations: uses in the body are what count
            stack.append(child)


def _plain_kinds(node: ast.AST) -> set[str]:
    """Reference kinds spelled out in ``node`` itself (no taint); kept on the node, as :func:`_walk`."""
    found: frozenset[str] | None = node.__dict__.get("_i11_kinds")
    if found is None:
        found = frozenset(_plain_kinds_once(node))
        node.__dict__["_i11_kinds"] = found
    return set(found)


def _plain_kinds_once(node: ast.AST) -> set[str]:
    kinds: set[str] = set()
    for n in _walk(node):
        names: list[str] = []
        if isinstance(n, ast.Name):
            names.append(n.id)
        elif isinstance(n, ast.Attribute):
            names.append(n.attr)
        elif isinstance(n, ast.keyword) and n.arg is not None:
            names.append(n.arg)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            if n.value in END_STRINGS:
                kinds.add(END)
            names.append(n.value)
        for name in names:
            if MID_NAME.match(name):
                kinds.add(MID)
            if END_NAME.match(name) or name == "TURN_END":
                kinds.add(END)
    return kinds


def _kinds(node: ast.AST | None, taint: Taint) -> set[str]:
    """Reference kinds in ``node``, spelled out or carried by tainted names."""
    if node is None:
        return set()
    kinds = _plain_kinds(node)
    for n in _walk(node):
        if isinstance(n, (ast.Name, ast.Attribute)):
            dotted = _dotted(n)
            if dotted is None:
                continue
            for kind in KINDS:
                if dotted in taint.names[kind]:
                    kinds.add(kind)
    return kinds


def _is_read(value: ast.AST) -> bool:
    """Whether a value reads data (a literal or an ``Enum.MEMBER`` does not)."""
    for n in _walk(value):
        if isinstance(n, (ast.Subscript, ast.Call)):
            return True
        if isinstance(n, ast.Name) and not n.id[:1].isupper() and n.id not in ("True", "False", "None"):
            return True
    return False


def _target_names(target: ast.expr) -> list[str]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for elt in target.elts for name in _target_names(elt)]
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    if isinstance(target, ast.Subscript):
        return _target_names(target.value)  # x[k] = v taints the container x
    dotted = _dotted(target)
    return [dotted] if dotted is not None else []


def _bindings(stmt: ast.AST) -> Iterator[tuple[ast.expr, ast.AST]]:
    """``(target, value)`` pairs a statement binds (including walrus and comprehension targets)."""
    if isinstance(stmt, ast.Assign):
        for target in stmt.targets:
            if (
                isinstance(target, ast.Tuple)
                and isinstance(stmt.value, ast.Tuple)
                and len(target.elts) == len(stmt.value.elts)
            ):
                yield from zip(target.elts, stmt.value.elts, strict=True)
            else:
                yield target, stmt.value
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) and stmt.value is not None:
        yield stmt.target, stmt.value
    elif isinstance(stmt, (ast.For, ast.AsyncFor)):
        yield stmt.target, stmt.iter
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
        for item in stmt.items:
            if item.optional_vars is not None:
                yield item.optional_vars, item.context_expr
    header = _header(stmt)
    for part in header:
        for n in _walk(part):
            if isinstance(n, ast.NamedExpr):
                yield n.target, n.value
            elif isinstance(n, ast.comprehension):
                yield n.target, n.iter
            elif (
                isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and n.func.attr in MUTATORS
                and (n.args or n.keywords)
            ):
                yield n.func.value, ast.Tuple(elts=[*n.args, *(k.value for k in n.keywords)], ctx=ast.Load())


def _header(stmt: ast.AST) -> list[ast.AST]:
    """The expressions a statement evaluates itself (not the statements of its bodies)."""
    match stmt:
        case ast.If() | ast.While():
            return [stmt.test]
        case ast.For() | ast.AsyncFor():
            return [stmt.target, stmt.iter]
        case ast.With() | ast.AsyncWith():
            return [item for i in stmt.items for item in (i.context_expr, i.optional_vars) if item is not None]
        case ast.Match():
            return [stmt.subject]
        case ast.Try():
            return [h.type for h in stmt.handlers if h.type is not None]
        case ast.FunctionDef() | ast.AsyncFunctionDef() | ast.ClassDef():
            return []
        case _:
            return [stmt]


@dataclass
class Branch:
    """A block of statements and the reference kinds of the condition that selects it."""

    body: list[ast.stmt]
    kinds: frozenset[str]


def _branches(stmt: ast.stmt, taint: Taint) -> Iterator[tuple[Branch, int | None]]:
    """Sub-blocks of a compound statement, with the line of the condition that selects each (if any)."""
    match stmt:
        case ast.If() | ast.While():
            yield Branch(stmt.body, frozenset(_kinds(stmt.test, taint))), stmt.lineno
            yield Branch(stmt.orelse, frozenset()), None
        case ast.For() | ast.AsyncFor():
            yield Branch(stmt.body, frozenset(_kinds(stmt.iter, taint))), None
            yield Branch(stmt.orelse, frozenset()), None
        case ast.With() | ast.AsyncWith():
            yield Branch(stmt.body, frozenset()), None
        case ast.Match():
            for case in stmt.cases:
                kinds = _kinds(case.pattern, taint) | _kinds(case.guard, taint)
                yield Branch(case.body, frozenset(kinds)), case.pattern.lineno
        case ast.Try():
            yield Branch(stmt.body, frozenset()), None
            for handler in stmt.handlers:
                yield Branch(handler.body, frozenset()), None
            yield Branch(stmt.orelse, frozenset()), None
            yield Branch(stmt.finalbody, frozenset()), None
        case _:
            return


def _statements(
    body: list[ast.stmt], taint: Taint, ctx: frozenset[str] = frozenset()
) -> Iterator[tuple[ast.stmt, frozenset[str]]]:
    """Every statement of a scope with the kinds of the conditions enclosing it."""
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield stmt, ctx
        for branch, _ in _branches(stmt, taint):
            yield from _statements(branch.body, taint, ctx | branch.kinds)


def _compute_taint(body: list[ast.stmt]) -> Taint:
    taint = Taint()
    while True:
        before = sum(len(v) for v in taint.names.values())
        for stmt, ctx in _statements(body, taint):
            for target, value in _bindings(stmt):
                kinds = _kinds(value, taint)
                if _is_read(value):
                    kinds |= ctx
                for name in _target_names(target):
                    for kind in kinds:
                        taint.names[kind].add(name)
        if sum(len(v) for v in taint.names.values()) == before:
            return taint


def _conditions(node: ast.AST) -> Iterator[ast.AST]:
    """Boolean conditions inside expressions: ``x if c else y``, comprehension filters, ``assert``."""
    for n in _walk(node):
        if isinstance(n, ast.IfExp):
            yield n.test
        elif isinstance(n, ast.comprehension):
            yield from n.ifs
        elif isinstance(n, ast.Assert):
            yield n.test


def _expression_contexts(node: ast.AST) -> Iterator[tuple[ast.AST, list[ast.AST]]]:
    """``(condition, governed parts)`` pairs inside expressions."""
    for n in _walk(node):
        if isinstance(n, ast.IfExp):
            yield n.test, [n.body]
        elif isinstance(n, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            governed: list[ast.AST] = [n.key, n.value] if isinstance(n, ast.DictComp) else [n.elt]
            for gen in n.generators:
                for cond in gen.ifs:
                    yield cond, governed
                yield gen.iter, governed


def _records(node: ast.AST, taint: Taint) -> Iterator[ast.AST]:
    """Dict displays, dict comprehensions, calls and item stores that key turn/end data by message."""
    for n in _walk(node):
        if isinstance(n, ast.Dict):
            mid_keys = [k for k in n.keys if k is not None and MID in _kinds(k, taint)]
            if mid_keys and any(END in _kinds(v, taint) for v in n.values):
                yield n
        elif isinstance(n, ast.DictComp):
            if MID in _kinds(n.key, taint) and END in _kinds(n.value, taint):
                yield n
        elif isinstance(n, ast.Call):
            mid_kw = [k for k in n.keywords if k.arg is not None and MID_NAME.match(k.arg)]
            others = [*n.args, *(k.value for k in n.keywords if k not in mid_kw)]
            if mid_kw and any(END in _kinds(v, taint) for v in others):
                yield n
        elif isinstance(n, ast.Assign):
            for target in n.targets:
                if (
                    isinstance(target, ast.Subscript)
                    and MID in _kinds(target.slice, taint)
                    and END in _kinds(n.value, taint)
                ):
                    yield n


def _sql_strings(node: ast.AST) -> Iterator[tuple[str, int]]:
    for n in _walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and SQL_START.match(n.value):
            yield n.value, n.lineno
        elif isinstance(n, ast.JoinedStr):
            text = "".join(v.value for v in n.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
            if SQL_START.match(text):
                yield text, n.lineno


def check_scope(body: list[ast.stmt], where: str) -> list[Finding]:
    """Findings of one scope (see the module docstring for the rules)."""
    taint = _compute_taint(body)
    found: list[Finding] = []

    def add(line: int, rule: str) -> None:
        found.append(Finding(where, line, rule))

    for stmt, ctx in _statements(body, taint):
        # Rule 1 (statement conditions) and rule 2 (bodies selected by one kind).
        for branch, line in _branches(stmt, taint):
            if line is not None and set(KINDS) <= branch.kinds:
                add(line, "a condition holds both a message id and turn/end")
        for part in _header(stmt):
            kinds = _kinds(part, taint)
            for kind in ctx:
                other = END if kind == MID else MID
                if other in kinds:
                    add(getattr(part, "lineno", stmt.lineno), f"{other} read under a {kind} condition")
            # Rule 1 and 2 inside expressions.
            for cond in _conditions(part):
                if set(KINDS) <= _kinds(cond, taint):
                    add(getattr(cond, "lineno", stmt.lineno), "a condition holds both a message id and turn/end")
            for cond, governed in _expression_contexts(part):
                ckinds = _kinds(cond, taint)
                for g in governed:
                    gkinds = _kinds(g, taint)
                    if (MID in ckinds and END in gkinds) or (END in ckinds and MID in gkinds):
                        add(getattr(g, "lineno", stmt.lineno), "a comprehension pairs a message id with turn/end")
            # Rule 3.
            for rec in _records(part, taint):
                add(getattr(rec, "lineno", stmt.lineno), "turn/end data keyed by a message id")
            # Rule 4.
            for sql, line in _sql_strings(part):
                if SQL_MID.search(sql) and SQL_END.search(sql):
                    add(line, "a query joins a message to its turn's end")
    unique = {(f.line, f.rule): f for f in found}
    return sorted(unique.values(), key=lambda f: (f.line, f.rule))


def _scopes(tree: ast.Module, module: str) -> Iterator[tuple[list[ast.stmt], str]]:
    yield tree.body, f"{module}:<module>"

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[list[ast.stmt], str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                yield child.body, f"{module}:{name}"
                yield from visit(child, f"{name}.")
            else:
                yield from visit(child, prefix)

    yield from visit(tree, "")


def check_source(source: str, module: str = "snippet") -> list[Finding]:
    """Every finding in one module's source."""
    tree = ast.parse(source)
    return [f for body, where in _scopes(tree, module) for f in check_scope(body, where)]


def production_files() -> list[Path]:
    """Every ``.py`` file of the production packages."""
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


# -- the consumer test -----------------------------------------------------------------------------


def test_no_production_code_correlates_message_ids_with_turn_end() -> None:
    findings = [
        f
        for path in production_files()
        for f in check_source(path.read_text(encoding="utf-8"), _module_name(path))
        if f.where not in ALLOWED
    ]
    assert findings == [], "invariant 11 (see this module's docstring):\n" + "\n".join(map(str, findings))


def test_the_scan_sees_the_production_code() -> None:
    files = production_files()
    names = {_module_name(p) for p in files}
    assert {"agent.driver", "agent.inbox", "agent.turns", "goals.engine"} <= names
    for pkg in PACKAGES:
        assert any(n.startswith(f"{pkg}.") for n in names), pkg
    # Both vocabularies still match the code: a rename that hid them would make the scan vacuous.
    seen = {MID: 0, END: 0}
    scopes = 0
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for body, _ in _scopes(tree, _module_name(path)):
            scopes += 1
            kinds: set[str] = set()
            for stmt in body:
                if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    kinds |= _plain_kinds(stmt)
            for kind in kinds:
                seen[kind] += 1
    assert scopes > 200
    assert seen[MID] >= 5 and seen[END] >= 5, seen


def test_allowlist_names_real_scopes() -> None:
    existing = {
        where
        for path in production_files()
        for _, where in _scopes(ast.parse(path.read_text(encoding="utf-8")), _module_name(path))
    }
    assert set(ALLOWED) <= existing, set(ALLOWED) - existing
    assert all(reason.strip() for reason in ALLOWED.values())


# -- self-tests: the checker flags correlation and passes clean code ------------------------------

OFFENDING = {
    "result map through the admitting turn": """
        def results(events):
            turn_of = {}
            out = {}
            for e in events:
                if e.type == EventType.MESSAGE_ADMITTED:
                    turn_of[e.data["turnId"]] = e.data["messageId"]
                elif e.type == EventType.TURN_END:
                    out[turn_of[e.data["turnId"]]] = e.data["reason"]
            return out
    """,
    "wait for my message's turn to end": """
        async def prompt(agent, sub, text):
            mid = await agent.enqueue(text)
            my_turn = None
            async for ev in sub:
                if ev.type == "message/admitted" and ev.data["messageId"] == mid:
                    my_turn = ev.data["turnId"]
                if ev.type == "turn/end" and ev.data["turnId"] == my_turn:
                    return ev.data["reason"]
    """,
    "match case guarded by the message's turn": """
        def outcome(events, message_id):
            turn = None
            for ev in events:
                d = ev.data
                match ev.type:
                    case "message/admitted" if d["messageId"] == message_id:
                        turn = d["turnId"]
                    case EventType.TURN_END if d["turnId"] == turn:
                        return d["reason"]
    """,
    "dict comprehension of end reasons by message": """
        def reasons(events):
            return {e.data["messageId"]: e.data["reason"] for e in events if e.type == "turn/end"}
    """,
    "result record carrying the message id": """
        def finish(events, mid):
            last = None
            for e in events:
                if e.type == EventType.TURN_END:
                    last = e.data["reason"]
            return PromptResult(message_id=mid, end_reason=last)
    """,
    "sql join from the inbox to the turn's end": """
        def outcome_of(conn, message_id):
            return conn.execute(
                "SELECT t.end_reason FROM inbox i JOIN turns t ON t.id = i.turn_id WHERE i.id = ?",
                (message_id,),
            ).fetchone()
    """,
    "method reading the end of the message's turn": """
        class Tracker:
            def on_event(self, ev):
                if ev.type == "message/admitted" and ev.data["messageId"] == self.message_id:
                    self.turn = ev.data["turnId"]
                elif ev.type == "turn/end" and ev.data["turnId"] == self.turn:
                    self.result = ev.data["reason"]
    """,
    "typed payloads: the end of my message's turn": """
        def outcome(events, message_id):
            turn = None
            for ev in events:
                p = ev.payload
                if isinstance(p, MessageAdmitted) and p.message_id == message_id:
                    turn = p.turn_id
                elif isinstance(p, TurnEnded) and p.turn_id == turn:
                    return p.reason
    """,
    "turn end reasons stored per message": """
        def record(ends, by_msg, msg_id):
            end_reason = ends[-1].data["reason"]
            by_msg[msg_id] = end_reason
    """,
}

CLEAN = {
    "enqueue returns a receipt": """
        async def prompt(agent, text, message_id=None):
            mid = await agent.enqueue(text, message_id=message_id)
            return {"messageId": mid}
    """,
    "continuation fate and the interval's last turn end": """
        def interval_facts(goal, events):
            fate = "none"
            cancel_reason = None
            last_reason = None
            turns = 0
            cid = goal.continuation_id
            for ev in events:
                d = ev.data
                match ev.type:
                    case EventType.MESSAGE_ADMITTED if d.get("messageId") == cid:
                        fate = "admitted"
                    case EventType.MESSAGE_CANCELLED if d.get("messageId") == cid:
                        fate, cancel_reason = "cancelled", d.get("reason")
                    case EventType.TURN_END:
                        turns += 1
                        last_reason = d.get("reason")
            return Interval(continuation_fate=fate, cancel_reason=cancel_reason, last_end_reason=last_reason,
                            turns=turns)
    """,
    "formatting events one at a time": """
        def describe(kind, d):
            match kind:
                case "message/queued":
                    return f"queued {d['messageId']}"
                case "turn/end":
                    return f"turn ended: {d['reason']}"
                case _:
                    return kind
    """,
    "an owned interval's run-level finish reason": """
        async def run(agent, sub, text):
            mid = await agent.enqueue(text)
            started = False
            finish = None
            async for ev in sub:
                if not started:
                    if ev.type == "message/queued" and ev.data["messageId"] == mid:
                        started = True
                    continue
                if ev.type == "turn/end":
                    finish = ev.data["reason"]
                if ev.type == "status" and ev.data["status"] == "idle":
                    return RunResult(final_response=None, finish_reason=finish)
    """,
    "an owned interval's finish reason, with a plain flag": """
        async def run(agent, sub, text):
            mid = await agent.enqueue(text)
            started = False
            finish = None
            async for ev in sub:
                if ev.type == "message/queued" and ev.data["messageId"] == mid:
                    started = True
                elif started and ev.type == "turn/end":
                    finish = ev.data["reason"]
                elif started and ev.type == "status" and ev.data["status"] == "idle":
                    return finish
    """,
    "typed payloads: run-level facts apart from the watch": """
        class Facts:
            def observe(self, event):
                ended = event.payload
                if isinstance(ended, TurnEnded):
                    self.last_end = ended

        class Watch:
            def observe(self, event):
                queued = event.payload
                if isinstance(queued, MessageQueued) and queued.message_id == self.message_id:
                    self.receipt_seq = event.seq
    """,
    "admission is recorded next to the message id": """
        def admit(tx, session_id, turn_id, rows):
            for row in rows:
                tx.emit(session_id, "message/admitted", {"messageId": row["id"], "turnId": turn_id})
    """,
    "closing a turn without messages": """
        def end_turn(tx, session_id, turn_id, end):
            data = {"turnId": turn_id, "reason": end.reason.value}
            tx.emit(session_id, EventType.TURN_END, data)
            tx.execute("UPDATE turns SET end_reason=? WHERE id=?", (end.reason.value, turn_id))
    """,
    "schema text names both tables": '''
        SCHEMA = """
        SELECT 1;
        """
        DDL = "CREATE TABLE inbox (id TEXT); CREATE TABLE turns (end_reason TEXT)"
        def f():
            """Reads the turn/end of a messageId? No: this docstring is prose."""
            return DDL
    ''',
}


@pytest.mark.parametrize("name", sorted(OFFENDING))
def test_checker_flags_correlation(name: str) -> None:
    findings = check_source(textwrap.dedent(OFFENDING[name]))
    assert findings, f"the checker missed: {name}"


@pytest.mark.parametrize("name", sorted(CLEAN))
def test_checker_passes_clean_code(name: str) -> None:
    assert check_source(textwrap.dedent(CLEAN[name])) == []
