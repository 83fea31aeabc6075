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
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, field_validator

from agent.tools.shellparse import Refusal, parse_commands

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
