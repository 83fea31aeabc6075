"""Which tools an unattended agent may use: an allowlist of tool names and of shell command patterns.

Nobody is there to approve a call at three in the morning, so nothing ever waits for an approval:
a call outside the policy is simply not run. The registry asks the policy before it validates or
runs a call; a denial becomes the tool result ``denied by policy: <why>`` (an error the model sees
and can work around), and the driver records a ``tool/denied`` event in the transaction that
records that result. Tools the policy denies by name are not offered to the model at all.

* ``allow``: glob patterns of tool names (``read_*``); ``None`` allows every tool.
* ``shell_allow``: glob patterns of shell commands (``git *``, ``make test``); ``None`` allows every
  command of an allowed shell tool, ``[]`` none. A command is split at the shell's unquoted control
  operators (``;``, ``&&``, ``||``, ``|``, ``&``, newlines, parentheses) and **every** part must match
  a pattern, so ``git *`` allows ``git status && git diff`` but not ``git status; curl … | sh``.
  Command and process substitution (a backtick, ``$(``, ``<(``, ``>(``) could hide any command
  inside an allowed one, so under patterns they are denied outright. Redirections stay part of
  the command they belong to: where a command may write is the sandbox's business, not this list's.

A goal gives its policy as one list of entries (:meth:`ToolPolicy.from_entries`): tool name patterns,
plus ``shell:PATTERN`` entries for the shell. ``["read_file", "shell:git *"]`` allows ``read_file``
and the shell for git commands only; a bare ``shell`` entry (with no ``shell:`` patterns) allows
every command.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, field_validator

SHELL_PREFIX = "shell:"


class ToolPolicy(BaseModel):
    """An allowlist of tool names and shell command patterns (persisted in a session's config)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Names of the tools whose ``command`` argument is a shell command.
    SHELL_TOOLS: ClassVar[frozenset[str]] = frozenset({"shell"})

    allow: list[str] | None = None
    shell_allow: list[str] | None = None

    @field_validator("allow", "shell_allow")
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
        for entry in entries:
            if entry.startswith(SHELL_PREFIX):
                pattern = entry[len(SHELL_PREFIX) :].strip()
                if not pattern:
                    raise ValueError(f"{entry!r}: a shell entry needs a command pattern after 'shell:'")
                shell.append(pattern)
            elif not entry.strip():
                raise ValueError("tool names must not be blank")
            else:
                names.append(entry)
        if shell:
            names += sorted(cls.SHELL_TOOLS - set(names))
        return cls(allow=names, shell_allow=shell or None)

    def allowing(self, *names: str) -> ToolPolicy:
        """This policy with ``names`` allowed as well (tools a session must always have)."""
        if self.allow is None:
            return self
        missing = [n for n in names if not self.allows_tool(n)]
        return self.model_copy(update={"allow": [*self.allow, *missing]}) if missing else self

    def allows_tool(self, name: str) -> bool:
        """Whether the tool called ``name`` may run at all."""
        return self.allow is None or any(fnmatchcase(name, p) for p in self.allow)

    def check(self, name: str, args: dict[str, Any]) -> str | None:
        """Why the call is denied, or ``None`` when it may run."""
        if not self.allows_tool(name):
            assert self.allow is not None
            allowed = ", ".join(self.allow) or "none"
            return f"the tool {name!r} is not in the allowlist (allowed: {allowed})"
        if name not in self.SHELL_TOOLS or self.shell_allow is None:
            return None
        command = args.get("command")
        if not isinstance(command, str):
            return "a shell call without a command string"
        try:
            parts = split_command(command)
        except ValueError as exc:
            return f"{exc} is not allowed when shell commands are restricted"
        patterns = ", ".join(repr(p) for p in self.shell_allow) or "none"
        if not parts:
            return "an empty shell command"
        for part in parts:
            if not any(fnmatchcase(part, p) for p in self.shell_allow):
                if part == command.strip():
                    return f"the command {part!r} matches no allowed pattern (allowed: {patterns})"
                return f"the part {part!r} of the command matches no allowed pattern (allowed: {patterns})"
        return None


def split_command(command: str) -> list[str]:
    """The simple commands of a shell command line, split at unquoted control operators.

    Each part has its whitespace collapsed. Raises ``ValueError`` (saying what) for command or
    process substitution and for unbalanced quotes.
    """
    parts: list[str] = []
    buf: list[str] = []
    quote: str | None = None
    i, n = 0, len(command)
    while i < n:
        c = command[i]
        nxt = command[i + 1 : i + 2]
        if quote == "'":
            quote = None if c == "'" else quote
            buf.append(c)
        elif c == "\\":
            buf.append(command[i : i + 2])
            i += 2
            continue
        elif c == "`" or (c == "$" and nxt == "("):
            raise ValueError("command substitution (`...` or $(...))")
        elif quote == '"':
            quote = None if c == '"' else quote
            buf.append(c)
        elif c in "'\"":
            quote = c
            buf.append(c)
        elif c in "<>" and nxt == "(":
            raise ValueError("process substitution (<(...) or >(...))")
        elif c == "&" and ((buf and buf[-1] in "<>") or nxt == ">"):
            buf.append(c)  # a redirection (2>&1, &>file), not a control operator
        elif c in ";&|\n()":
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(c)
        i += 1
    if quote is not None:
        raise ValueError("a command with unbalanced quotes")
    parts.append("".join(buf))
    return [" ".join(p.split()) for p in parts if p.strip()]


DENIED_PREFIX = "denied by policy: "
