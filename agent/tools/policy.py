"""Which tools an unattended agent may use: an allowlist of tool names and of shell command patterns.

Nobody is there to approve a call at three in the morning, so nothing ever waits for an approval:
a call outside the policy is simply not run. The registry asks the policy before it validates or
runs a call; a denial becomes the tool result ``denied by policy: <why>`` (an error the model sees
and can work around), and the driver records a ``tool/denied`` event in the transaction that
records that result. Tools the policy denies by name are not offered to the model at all.

* ``allow``: glob patterns of tool names (``read_*``); ``None`` allows every tool.
* ``shell_allow``: glob patterns of shell commands (``git *``, ``make test``); ``None`` allows every
  command of an allowed shell tool, ``[]`` none.

A pattern is matched against words, and bash runs the string, not the words: matching a pattern
against the text of a command line cannot be sound (with ``shell:ls *``, ``ls ${_@P}`` re-expands
the previous argument, ``'$(touch X; id > X)'``, and runs ``id``). So under patterns a command line
is first parsed with a real shell parser (:func:`agent.tools.shellparse.parse_commands`, on
``bashlex``) and allowed only when it is **plain simple commands**: literal words, joined by ``;``,
``&&``, ``||``, ``|``, ``&`` and newlines, optionally grouped in ``( )`` or ``{ ; }``. Then **every**
command must match a pattern, as its words after quote removal (``'l''s' -la`` is ``ls -la``) and
its redirections (``2>&1``, ``>out.txt``), joined by single spaces; ``git *`` allows
``git status && git diff`` but not ``git status; curl … | sh``. Refused whatever the patterns say,
with the construct named in the reason: every expansion bash would perform (parameters such as
``$x``, ``${_@P}``, ``$@``; command and process substitution; arithmetic; brace expansion; a
here-document it would expand), assignments (``BASH_ENV=x ls``), function definitions and
compound commands (``if``, ``for``, ``while``, ``case``), builtins that run text as code or assign
variables by an evaluated name (``eval``, ``source``, ``exec``, ``command``, ``builtin``, ``trap``,
``declare``, ``read``, ``printf -v`` …), a command name with a backslash or glob in it, a
redirection to anything but a relative path without ``..`` (or ``/dev/null``), a line longer than
4096 characters, and anything the parser cannot read. Globs and ``~`` in arguments are allowed:
they expand inside the sandbox. A pattern that allows a program which runs others (``env *``,
``xargs *``, ``find *`` with ``-exec``, ``bash *``) allows what that program runs: the list trusts
the programs it names.

A goal gives its policy as one list of entries (:meth:`ToolPolicy.from_entries`): tool name patterns,
plus ``shell:PATTERN`` entries for the shell. ``["read_file", "shell:git *"]`` allows ``read_file``
and the shell for git commands only; a bare ``shell`` entry (with no ``shell:`` patterns) allows
every command.

**Ask instead of deny.** ``ask:shell`` asks the operator about every shell command the patterns do
not allow, ``ask:shell:PATTERN`` about those matching ``PATTERN`` only (as its simple commands,
parsed as above; a line that is not one simple command matches only ``*``), and ``ask:NAME`` about
every call of the tools matching ``NAME``. A call the policy asks about is an :class:`Ask`: the
registry hands it to its ``approver`` (a goal's: the call becomes an approval question,
:mod:`goals.approvals`), and without one it is denied (nobody can be asked). The question always
shows the whole command line, and says when it is not one simple command, with why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, field_validator

from agent.tools.shellparse import Refusal, parse_commands

SHELL_PREFIX = "shell:"
ASK_PREFIX = "ask:"


@dataclass(frozen=True)
class Ask:
    """A call the policy asks the operator about, rather than allowing or denying it."""

    tool: str
    #: The whole command line of a shell call (``None``: another tool's call).
    command: str | None
    #: The call's arguments as JSON (sorted keys): what an approval of another tool's call is for.
    args: str
    #: Why the line is not one simple command (the parser's refusal, or how many commands it
    #: joins); ``None`` when it is one.
    compound: str | None
    #: Why it is asked: what the policy would have denied it for, or that the tool is always asked.
    reason: str

    @property
    def key(self) -> str:
        """What an approval is for: the exact command line, or the tool and its exact arguments."""
        return f"{self.tool}: {self.command}" if self.command is not None else f"{self.tool} {self.args}"


class ToolPolicy(BaseModel):
    """An allowlist of tool names and shell command patterns (persisted in a session's config)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Names of the tools whose ``command`` argument is a shell command.
    SHELL_TOOLS: ClassVar[frozenset[str]] = frozenset({"shell"})

    allow: list[str] | None = None
    shell_allow: list[str] | None = None
    #: Tool name patterns whose calls are asked about (``ask:NAME``), and shell command patterns
    #: asked about when the allowed ones do not match (``ask:shell:PATTERN``; ``*``: every command).
    ask: list[str] | None = None
    shell_ask: list[str] | None = None

    @field_validator("allow", "shell_allow", "ask", "shell_ask")
    @classmethod
    def _patterns(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            for pattern in value:
                if not pattern.strip():
                    raise ValueError("patterns must not be blank")
        return value

    @classmethod
    def from_entries(cls, entries: list[str]) -> ToolPolicy:
        """A policy from one list of tool name patterns and ``shell:PATTERN`` entries."""
        names: list[str] = []
        shell: list[str] = []
        ask: list[str] = []
        shell_ask: list[str] = []
        for entry in entries:
            if entry.startswith(ASK_PREFIX):
                what = entry[len(ASK_PREFIX) :].strip()
                if not what:
                    raise ValueError(f"{entry!r}: an ask entry needs a tool name, 'shell' or 'shell:PATTERN'")
                if what == "shell":
                    shell_ask.append("*")
                elif what.startswith(SHELL_PREFIX):
                    pattern = what[len(SHELL_PREFIX) :].strip()
                    if not pattern:
                        raise ValueError(f"{entry!r}: an ask:shell: entry needs a command pattern")
                    shell_ask.append(pattern)
                else:
                    ask.append(what)
            elif entry.startswith(SHELL_PREFIX):
                pattern = entry[len(SHELL_PREFIX) :].strip()
                if not pattern:
                    raise ValueError(f"{entry!r}: a shell entry needs a command pattern after 'shell:'")
                shell.append(pattern)
            elif not entry.strip():
                raise ValueError("tool names must not be blank")
            else:
                names.append(entry)
        if shell or shell_ask:
            names += sorted(cls.SHELL_TOOLS - set(names))
        if shell_ask and not shell:
            shell = []  # asked about: no command runs without an answer unless a pattern allows it
            return cls(allow=names, shell_allow=shell, ask=ask or None, shell_ask=shell_ask)
        return cls(allow=names, shell_allow=shell or None, ask=ask or None, shell_ask=shell_ask or None)

    def allowing(self, *names: str) -> ToolPolicy:
        """This policy with ``names`` allowed as well (tools a session must always have)."""
        if self.allow is None:
            return self
        missing = [n for n in names if not self.allows_tool(n)]
        return self.model_copy(update={"allow": [*self.allow, *missing]}) if missing else self

    def allows_tool(self, name: str) -> bool:
        """Whether the tool called ``name`` may run at all (asked about or not)."""
        return self.allow is None or any(fnmatchcase(name, p) for p in self.allow) or self._asks_tool(name)

    def _asks_tool(self, name: str) -> bool:
        return self.ask is not None and any(fnmatchcase(name, p) for p in self.ask)

    def asks(self, name: str, args: dict[str, Any], denied: str | None) -> Ask | None:
        """The question the call is, when the policy asks about it (``denied``: what :meth:`check` said)."""
        arg_text = json.dumps(args, sort_keys=True, ensure_ascii=False)
        if name in self.SHELL_TOOLS and self.shell_ask is not None and denied is not None:
            command = args.get("command")
            if not isinstance(command, str):
                return None
            parsed = parse_commands(command)
            if isinstance(parsed, Refusal):
                compound: str | None = parsed.reason
                parts = [command]
                matches = "*" in self.shell_ask
            else:
                compound = f"it joins {len(parsed)} commands" if len(parsed) > 1 else None
                parts = [simple.text for simple in parsed]
                matches = all(any(fnmatchcase(part, p) for p in self.shell_ask) for part in parts)
            if matches:
                return Ask(tool=name, command=command, args=arg_text, compound=compound, reason=denied)
            return None
        if self._asks_tool(name) and name not in self.SHELL_TOOLS:
            reason = denied or f"the policy asks before every call of {name!r}"
            return Ask(tool=name, command=None, args=arg_text, compound=None, reason=reason)
        return None

    def check(self, name: str, args: dict[str, Any]) -> str | None:
        """Why the call is denied, or ``None`` when it may run."""
        if self._asks_tool(name) and name not in self.SHELL_TOOLS:
            return f"the policy asks before every call of {name!r}"
        if not self.allows_tool(name):
            assert self.allow is not None
            allowed = ", ".join(self.allow) or "none"
            return f"the tool {name!r} is not in the allowlist (allowed: {allowed})"
        if name not in self.SHELL_TOOLS or self.shell_allow is None:
            return None
        command = args.get("command")
        if not isinstance(command, str):
            return "a shell call without a command string"
        parsed = parse_commands(command)
        if isinstance(parsed, Refusal):
            return parsed.reason
        patterns = ", ".join(repr(p) for p in self.shell_allow) or "none"
        for simple in parsed:
            part = simple.text
            if not any(fnmatchcase(part, p) for p in self.shell_allow):
                if len(parsed) == 1:
                    return f"the command {part!r} matches no allowed pattern (allowed: {patterns})"
                return f"the part {part!r} of the command matches no allowed pattern (allowed: {patterns})"
        return None


def split_command(command: str) -> list[str]:
    """The simple commands of a shell command line, each as the text a ``shell:`` pattern is matched
    against (words after quote removal, then redirections, joined by single spaces).

    Raises ``ValueError`` with the reason when the line is not plain simple commands (see
    :func:`agent.tools.shellparse.parse_commands`).
    """
    parsed = parse_commands(command)
    if isinstance(parsed, Refusal):
        raise ValueError(parsed.reason)
    return [simple.text for simple in parsed]


DENIED_PREFIX = "denied by policy: "
