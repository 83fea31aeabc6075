"""A bash command line read as plain simple commands, or refused with the construct that was refused.

A pattern can only be checked against words it can see. :func:`parse_commands` parses a command
line with a real shell parser (``bashlex``) and accepts it only when it is simple commands joined
by ``;``, ``&&``, ``||``, ``|``, ``|&``, ``&`` and newlines (optionally grouped in ``( )`` or
``{ ; }``), each made of literal words: what bash would run is then exactly the words it returns.
Everything else is a :class:`Refusal` naming the construct, in plain words:

* any expansion bash would perform on the text: parameters (``$x``, ``${x}``, ``$@``, ``$_``,
  ``${_@P}``), command substitution (``$(…)``, backticks), process substitution (``<(…)``),
  arithmetic (``$((…))``, ``((…))``), ``$'…'`` and ``$"…"`` quoting, brace expansion
  (``{a,b}``), and a here-document whose body would be expanded;
* assignments (``PATH=. ls``, ``BASH_ENV=x ls``, ``x=1``), function definitions, ``if``/``for``/
  ``while``/``case`` and the other compound commands;
* builtins that run text as shell code, change how later commands are found, or assign variables
  by a name that bash evaluates (``a[$(id)]`` runs ``id``): ``eval``, ``source``, ``.``, ``exec``,
  ``command``, ``builtin``, ``trap``, ``declare``, ``read``, ``printf -v``, ``test -v`` …;
* a command name with a backslash, a glob or a leading ``~`` in it (``l\\s``, ``l?``);
* a redirection to anything but a literal relative path without ``..`` (or ``/dev/null``), or any
  file redirection in a line that changes directory; duplicating or closing a descriptor
  (``2>&1``, ``>&2``, ``<&-``) is fine;
* anything the parser cannot parse, or text the parse does not account for, and any line longer
  than :data:`MAX_PARSED_CHARS` (the parse takes some 50 µs a character).

Quoting is read by goald itself (:mod:`agent.tools.shellwords`), not taken from the parser: a
word's value is its text with bash's quote removal, and a word whose text holds anything goald
does not understand is refused, so the parser and bash cannot disagree silently. Globs and ``~``
in arguments are allowed: they expand inside the sandbox, to names there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from agent.tools.shellwords import Refusal, Refused, Word, cut, has_glob, read_word, refuse, snippet, uses

__all__ = ["Refusal", "SimpleCommand", "parse_commands", "parse_simple"]


@dataclass(frozen=True)
class SimpleCommand:
    """One simple command: its words after quote removal (the name first) and its redirections,
    each written without spaces (``>out.txt``, ``2>&1``, ``<<EOF``)."""

    words: tuple[str, ...]
    redirects: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """The words, then the redirections, joined by single spaces: what a pattern is matched against."""
        return " ".join((*self.words, *self.redirects))


#: The longest command line parsed: bashlex takes some 50 µs a character, and the check runs in the
#: daemon's event loop. Longer lines are refused (``write_file`` writes long text).
MAX_PARSED_CHARS = 4096

#: Builtins refused whatever the patterns say, with what they do.
_RUNS_CODE = "runs text as shell code that no pattern sees"
_ASSIGNS = "assigns shell variables by a name bash evaluates (a name like a[$(id)] runs id)"
_CHANGES_LOOKUP = "changes how the shell finds or runs later commands"
DENIED_BUILTINS: dict[str, str] = {
    "eval": _RUNS_CODE,
    "source": "runs a file as shell code that no pattern sees",
    ".": "runs a file as shell code that no pattern sees",
    "exec": "replaces the shell with a command or changes the shell's descriptors",
    "command": "runs its arguments as a command past the pattern's view of the name",
    "builtin": "runs its arguments as a builtin past the pattern's view of the name",
    "trap": "stores shell code to run later",
    "enable": _CHANGES_LOOKUP,
    "alias": _CHANGES_LOOKUP,
    "unalias": _CHANGES_LOOKUP,
    "hash": _CHANGES_LOOKUP,
    "shopt": _CHANGES_LOOKUP,
    "declare": _ASSIGNS,
    "typeset": _ASSIGNS,
    "local": _ASSIGNS,
    "export": _ASSIGNS,
    "readonly": _ASSIGNS,
    "unset": _ASSIGNS,
    "let": _ASSIGNS,
    "read": _ASSIGNS,
    "mapfile": _ASSIGNS,
    "readarray": _ASSIGNS,
    "getopts": _ASSIGNS,
    "compgen": _RUNS_CODE,
    "complete": _RUNS_CODE,
    "compopt": _RUNS_CODE,
    "bind": _RUNS_CODE,
    "fc": _RUNS_CODE,
    "history": _RUNS_CODE,
}
#: Reserved words and keywords that are not simple commands (bash reads them even where the parser
#: might take them for a command name).
_RESERVED = frozenset(
    {"[[", "]]", "{", "}", "!", "case", "coproc", "select", "function", "time"}
    | {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "for", "in", "esac"}
)
#: Directory changes: a relative redirection after one would not be relative to the work directory.
_CHANGES_DIRECTORY = frozenset({"cd", "pushd", "popd"})
#: ``set`` options that change nothing about what runs: -e, -u, -x and -o pipefail/errexit/….
_SET_FLAGS = re.compile(r"[-+][eux]+o?|[-+]o|pipefail|errexit|nounset|xtrace")
_FILE_REDIRECTS = frozenset({">", ">>", "<", "<>", ">|", "&>", "&>>"})
_DUPLICATIONS = frozenset({">&", "<&"})
_HEREDOCS = frozenset({"<<", "<<-"})
_LIST_OPERATORS = frozenset({";", "&&", "||", "&", "\n"})
#: Compound commands, by bashlex's kind.
_COMPOUNDS = {"if": "an if statement", "for": "a for loop", "while": "a while loop", "until": "an until loop"}
#: What bashlex calls the constructs it does not implement.
_UNSUPPORTED = {
    "time command": "the time keyword",
    "coproc": "a coprocess (coproc)",
    "select command": "a select loop",
    "pattern": "a case statement",
}


class _Reader:
    """Walks bashlex's tree, collecting simple commands and the spans of text it accounted for."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.covered = bytearray(len(text))
        self.commands: list[SimpleCommand] = []
        #: File redirections seen, checked once the whole line is read (a ``cd`` anywhere voids them).
        self.files: list[str] = []
        self.changes_directory = False

    def cover(self, node: Any, expected: str | None = None) -> None:
        """Mark ``node``'s text as read; when ``expected`` is given, it must be exactly that text."""
        start, end = node.pos
        if expected is not None and self.text[start:end] != expected:
            raise refuse(
                "text the parser misplaced",
                f"the command has text the parser placed oddly ({cut(self.text[start:end])!r})",
            )
        self.cover_span(start, end)

    def cover_span(self, start: int, end: int) -> None:
        """Mark ``text[start:end]`` as read."""
        self.covered[start:end] = b"\1" * (end - start)

    def raw(self, node: Any) -> str:
        start, end = node.pos
        return self.text[start:end]

    def node(self, node: Any) -> None:
        kind = node.kind
        if kind == "list":
            for part in node.parts:
                if part.kind == "operator":
                    if part.op not in _LIST_OPERATORS:
                        raise refuse(f"the operator {part.op}", f"the command uses the operator {part.op!r}")
                    self.cover(part, part.op)
                else:
                    self.node(part)
        elif kind == "pipeline":
            for part in node.parts:
                if part.kind == "pipe":
                    self.cover(part, part.pipe)
                elif part.kind == "reservedword" and part.word == "!":
                    self.cover(part, "!")
                else:
                    self.node(part)
        elif kind == "compound":
            self.compound(node)
        elif kind == "command":
            self.command(node)
        elif kind == "function":
            raise uses("a function definition", cut(self.raw(node)))
        elif kind in _COMPOUNDS:
            raise uses(_COMPOUNDS[kind], cut(self.raw(node)))
        else:
            raise uses(f"a {kind} construct", cut(self.raw(node)))

    def compound(self, node: Any) -> None:
        parts = list(node.list)
        first, last = parts[0], parts[-1]
        opening = first.word if first.kind == "reservedword" else None
        closing = last.word if last.kind == "reservedword" else None
        if (opening, closing) not in (("(", ")"), ("{", "}")):
            inner = next((p for p in parts if p.kind != "reservedword"), first)
            self.node(inner)  # refuses it, by its kind
            raise uses("a compound command", cut(self.raw(node)))
        if self.text.startswith("((", node.pos[0]):
            raise uses("an arithmetic command", cut(self.raw(node)))
        self.cover(first, opening)
        self.cover(last, closing)
        for part in parts[1:-1]:
            if part.kind == "reservedword":
                raise uses(f"the keyword {part.word!r}")
            self.node(part)
        for redirect in getattr(node, "redirects", None) or []:
            self.redirect(redirect, [])

    def command(self, node: Any) -> None:
        words: list[str] = []
        redirects: list[str] = []
        first: Word | None = None
        for part in node.parts:
            if part.kind == "assignment":
                raise uses("an assignment", self.raw(part))
            if part.kind == "redirect":
                self.redirect(part, redirects)
            elif part.kind == "word":
                self.cover(part)
                word = read_word(self.raw(part))
                if first is None:
                    first = word
                    self.name(word, self.raw(part))
                words.append(word.value)
            else:
                raise uses(f"a {part.kind} construct", cut(self.raw(part)))
        if not words:
            raise refuse("a redirection without a command", "the command has a redirection without a command")
        self.arguments(words)
        self.commands.append(SimpleCommand(tuple(words), tuple(redirects)))

    def name(self, word: Word, raw: str) -> None:
        name = word.value
        if "=" in name:
            raise uses("an assignment", raw)
        if word.escaped:
            raise uses("a backslash in the command name", raw)
        if has_glob(word.shape):
            raise uses("a glob in the command name", raw)
        if word.shape.startswith("~"):
            raise uses("a ~ in the command name", raw)
        if not name:
            raise refuse("an empty command name", "the command has an empty command name")
        if name in _RESERVED:
            raise uses(f"the keyword {name!r}")
        if name in DENIED_BUILTINS:
            raise refuse(name, f"the command runs {name!r}, which {DENIED_BUILTINS[name]}")
        if name in _CHANGES_DIRECTORY:
            self.changes_directory = True

    def arguments(self, words: list[str]) -> None:
        name, args = words[0], words[1:]
        if name == "printf" and any(a.startswith("-v") for a in args):
            raise refuse("printf -v", f"the command runs 'printf -v', which {_ASSIGNS}")
        if name in ("test", "[") and any(a in ("-v", "-R") for a in args):
            raise refuse(f"{name} -v", f"the command runs '{name} -v', which evaluates a variable's name")
        if name == "wait" and any(a.startswith("-") and "p" in a for a in args):
            raise refuse("wait -p", f"the command runs 'wait -p', which {_ASSIGNS}")
        if name == "set" and not all(_SET_FLAGS.fullmatch(a) for a in args):
            raise refuse(
                "set",
                "the command runs 'set' with options other than -e, -u, -x and -o pipefail, which " + _CHANGES_LOOKUP,
            )

    def redirect(self, node: Any, into: list[str]) -> None:
        kind: str = node.type
        fd = node.input
        if fd is not None and not isinstance(fd, int):
            raise uses("a redirection from a computed descriptor", self.raw(node))
        prefix = f"{fd if fd is not None else ''}{kind}"
        head = re.escape(prefix) + "[ \t]*"
        start, end = node.pos
        target = node.output
        if isinstance(target, int) or target == "-":
            if kind not in _DUPLICATIONS or not re.fullmatch(head + re.escape(str(target)), self.raw(node)):
                raise uses("an unusual redirection", self.raw(node))
            self.cover_span(start, end)
            into.append(f"{prefix}{target}")
            return
        if getattr(target, "kind", None) != "word" or not re.fullmatch(head, self.text[start : target.pos[0]]):
            raise uses("an unusual redirection", self.raw(node))
        self.cover_span(start, target.pos[0])
        self.cover(target)
        if kind in _HEREDOCS:
            self.heredoc(node, kind, self.raw(target))
            into.append(f"{prefix}{self.raw(target)}")
            return
        word = read_word(self.raw(target))
        if kind == "<<<":
            into.append(f"{prefix}{word.value}")
            return
        if kind in _DUPLICATIONS:
            # bash expands the word of `>&word` a second time, quotes removed: `>&'$(id)'` runs id.
            raise uses(f"a {kind} redirection to a file (write &> or > instead)", self.raw(node))
        if kind not in _FILE_REDIRECTS:
            raise uses(f"the redirection {kind}", self.raw(node))
        path = word.value
        if has_glob(word.shape) or "~" in word.shape:
            raise uses("an expanding redirection target", self.raw(target))
        if path != "/dev/null":
            if not path or path.startswith("/") or ".." in path.split("/"):
                raise refuse(
                    "a redirection outside the work directory",
                    f"the command redirects to {path!r}, outside the work directory "
                    "(a redirection may name a relative path without '..', or /dev/null)",
                )
            self.files.append(path)
        into.append(f"{prefix}{path}")

    def heredoc(self, node: Any, kind: str, delimiter: str) -> None:
        """A here-document: a plain delimiter, and a body bash would not expand, ending where bash ends it."""
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", delimiter):
            raise uses("a here-document with a quoted or unusual delimiter", delimiter)
        body_node = node.heredoc
        start, end = body_node.pos
        body = self.raw(body_node)
        for i, c in enumerate(body):
            if c in "$`\\":
                raise uses("a here-document with expansion", snippet(body, i) if c != "\\" else "\\")
        lines = [line.lstrip("\t") if kind == "<<-" else line for line in body.split("\n")]
        if (
            lines[-1] != delimiter
            or delimiter in lines[:-1]
            or self.text[start - 1 : start] != "\n"
            or self.text[end : end + 1] not in ("", "\n")
        ):
            raise refuse(
                "a here-document read oddly", "the command has a here-document the parser may read differently"
            )
        self.cover_span(start, end)

    def finish(self) -> None:
        if self.changes_directory and self.files:
            raise refuse(
                "a redirection after cd",
                f"the command changes directory and redirects to {self.files[0]!r}, which would not be "
                "relative to the work directory",
            )
        text, i, n = self.text, 0, len(self.text)
        while i < n:
            c = text[i]
            if self.covered[i] or c in " \t\n":
                i += 1
            elif c == "\\" and text[i + 1 : i + 2] == "\n":
                i += 2
            elif c == "#" and (i == 0 or text[i - 1] in " \t\n;&|()"):
                end = text.find("\n", i)
                end = n if end < 0 else end
                if any(self.covered[i:end]):
                    raise refuse("an unclear comment", "the command has a comment the parser read differently")
                i = end
            else:
                raise refuse(
                    "text the parser skipped",
                    f"the command has text the parser did not account for ({cut(text[i:])!r})",
                )


def _parse_failure(command: str, exc: Exception) -> Refusal:
    if all(not line.strip() or line.lstrip().startswith("#") for line in command.splitlines()):
        return Refusal("an empty command", "an empty shell command")
    message = str(exc).strip() or type(exc).__name__
    if isinstance(exc, NotImplementedError):
        if "arithmetic" in message:
            return uses("arithmetic expansion", "$((...)) or $[...]").refusal
        kind = re.search(r"type = \{([^}]*)\}", message)
        what = _UNSUPPORTED.get(kind.group(1), kind.group(1)) if kind else message
        return Refusal(what, f"the command uses {what}, which the shell parser does not support")
    if type(exc).__name__ == "MatchedPairError":
        return Refusal("unbalanced quotes or brackets", f"the command has unbalanced quotes or brackets ({message})")
    return Refusal("a command that does not parse", f"the command does not parse as a shell command ({message})")


def parse_commands(command: str) -> list[SimpleCommand] | Refusal:
    """The simple commands of a bash command line, in order, or why it is not only simple commands."""
    if not command.strip():
        return Refusal("an empty command", "an empty shell command")
    if len(command) > MAX_PARSED_CHARS:
        return Refusal(
            "a long command",
            f"the command is {len(command)} characters long, more than the {MAX_PARSED_CHARS} the shell policy "
            "parses (write long text with a file tool)",
        )
    import bashlex  # lazily: importing it takes about a quarter of a second

    try:
        trees = bashlex.parse(command)
    except Exception as exc:  # bashlex raises parse errors, NotImplementedError and worse
        return _parse_failure(command, exc)
    reader = _Reader(command)
    try:
        for tree in trees:
            reader.node(tree)
        reader.finish()
    except Refused as refused:
        return refused.refusal
    except (AttributeError, IndexError, TypeError, ValueError, RecursionError) as exc:  # a tree not foreseen
        return Refusal("a command that does not parse", f"the command has a shape the policy cannot read ({exc})")
    if not reader.commands:
        return Refusal("an empty command", "an empty shell command")
    return reader.commands


def parse_simple(command: str) -> list[list[str]] | Refusal:
    """The words of each simple command of ``command`` (quotes removed, the name first), or why it
    is not plain simple commands (compound constructs, expansions, redirections out of the work
    directory …): ``ls -la && git diff`` is ``[["ls", "-la"], ["git", "diff"]]``."""
    parsed = parse_commands(command)
    if isinstance(parsed, Refusal):
        return parsed
    return [list(c.words) for c in parsed]
