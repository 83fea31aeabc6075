"""One word of a bash command line read as bash would read it, or refused: the quoting goald reads
itself (:func:`read_word`), and the :class:`Refusal` a line gets for the construct it uses.

Quote removal is done here, not taken from the shell parser (:mod:`agent.tools.shellparse`): a
word's value is its text with bash's quote removal (``'l''s'`` is ``ls``, ``"a\\"b"`` is ``a"b``),
and a word whose text holds an expansion, or anything this module does not understand, is refused,
so the parser and bash cannot disagree silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.errors import AgentError

__all__ = ["Refusal", "Refused", "Word", "cut", "has_glob", "read_word", "refuse", "snippet", "uses"]


@dataclass(frozen=True)
class Refusal:
    """Why a command line is not plain simple commands: ``construct`` names what was refused,
    ``reason`` says it in a sentence (``the command uses parameter expansion (${_@P}), …``)."""

    construct: str
    reason: str

    def __str__(self) -> str:
        return self.reason


class Refused(AgentError):
    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.reason)
        self.refusal = refusal


def uses(construct: str, detail: str | None = None) -> Refused:
    shown = f"{construct} ({detail})" if detail else construct
    return Refused(Refusal(construct, f"the command uses {shown}, which a shell pattern cannot check"))


def refuse(construct: str, reason: str) -> Refused:
    return Refused(Refusal(construct, reason))


#: Characters bash ends an unquoted word at: inside a word's text they mean the parse and bash differ.
_WORD_BREAKS = frozenset(" \t\n;&|<>()")
_BRACE_EXPANSION = re.compile(r"\{[^{}]*(,|\.\.)[^{}]*\}")
_NAMED_DESCRIPTOR = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")
_QUOTED = "\0"  # stands for a quoted or escaped character in a word's shape


def _balanced(text: str, at: int) -> int:
    """Where the bracket opening at ``text[at]`` closes (just past it), or the end of ``text``."""
    opening = text[at]
    closing = {"{": "}", "(": ")", "[": "]"}[opening]
    depth = 0
    for i in range(at, len(text)):
        if text[i] == opening:
            depth += 1
        elif text[i] == closing:
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def snippet(text: str, start: int) -> str:
    """The expansion starting at ``text[start]`` (``$``, a backtick, ``<`` or ``>``), as written, cut short."""
    if text[start] == "`":
        end = text.find("`", start + 1)
        end = len(text) if end < 0 else end + 1
    elif text[start + 1 : start + 2] in ("{", "(", "["):
        end = _balanced(text, start + 1)
    else:
        match = re.match(r"\$([A-Za-z_][A-Za-z0-9_]*|.)?", text[start:])
        end = start + (match.end() if match else 1)
    return cut(text[start:end])


def _dollar(text: str, at: int) -> Refused:
    nxt = text[at + 1 : at + 3]
    shown = snippet(text, at)
    if nxt.startswith("(("):
        return uses("arithmetic expansion", shown)
    if nxt.startswith("("):
        return uses("command substitution", shown)
    if nxt.startswith("["):
        return uses("arithmetic expansion", shown)
    if nxt.startswith("'"):
        return uses("ANSI-C quoting", "$'...'")
    if nxt.startswith('"'):
        return uses('locale quoting ($"...")')
    return uses("parameter expansion", shown)


@dataclass(frozen=True)
class Word:
    value: str
    #: The unquoted characters as written, every quoted or escaped one as ``_QUOTED``.
    shape: str
    escaped: bool


def read_word(text: str) -> Word:
    """Quote removal on one word's text, refusing every expansion and anything not understood."""
    value: list[str] = []
    shape: list[str] = []
    escaped = False
    i, n = 0, len(text)

    def literal(chars: str) -> None:
        value.append(chars)
        shape.append(_QUOTED * len(chars))

    while i < n:
        c = text[i]
        if c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise uses("unbalanced quotes")
            literal(text[i + 1 : end])
            i = end + 1
        elif c == '"':
            i += 1
            while True:
                if i >= n:
                    raise uses("unbalanced quotes")
                d = text[i]
                if d == '"':
                    i += 1
                    break
                if d == "\\" and i + 1 < n and text[i + 1] in '"\\$`\n':
                    if text[i + 1] != "\n":
                        literal(text[i + 1])
                    i += 2
                elif d == "$":
                    raise _dollar(text, i)
                elif d == "`":
                    raise uses("command substitution", snippet(text, i))
                else:
                    literal(d)
                    i += 1
        elif c == "\\":
            if i + 1 >= n:
                escaped = True
                literal("\\")
                i += 1
            else:
                if text[i + 1] != "\n":  # a line continuation is removed
                    escaped = True
                    literal(text[i + 1])
                i += 2
        elif c == "$":
            raise _dollar(text, i)
        elif c == "`":
            raise uses("command substitution", snippet(text, i))
        elif c in "<>" and text[i + 1 : i + 2] == "(":
            raise uses("process substitution", snippet(text, i))
        elif c in _WORD_BREAKS:
            raise refuse(
                "an ambiguous word", f"the command has a word the parser and bash may read differently ({text!r})"
            )
        else:
            value.append(c)
            shape.append(c)
            i += 1
    word = Word("".join(value), "".join(shape), escaped)
    match = _BRACE_EXPANSION.search(word.shape)
    if match:
        raise uses("brace expansion", text)
    if _NAMED_DESCRIPTOR.fullmatch(word.shape):
        raise uses("a named descriptor", text)
    return word


def has_glob(shape: str) -> bool:
    return "*" in shape or "?" in shape or ("[" in shape and "]" in shape[shape.index("[") :])


def cut(text: str, limit: int = 40) -> str:
    """``text`` with its whitespace collapsed, cut at ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
