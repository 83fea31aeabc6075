"""``goald goal answer``, ``goal withdraw`` and ``goal questions``: what a goal asked its operator.

A goal that asked (``ask_operator``) waits, ``waiting (question: …)``, until one answer closes its
question: ``goald goal answer KEY [QUESTION_ID] TEXT`` (or ``--option N`` for one of its options)
answers it and the goal goes on at once; ``goal withdraw KEY [QUESTION_ID] --reason R`` withdraws it
(the goal hears the reason). A second answer is refused, naming who answered first and when (exit 4,
a conflict). ``goal questions [KEY] [--open]`` lists them.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from daemon.cli.parser import EXIT_OK, UsageError, print_json
from daemon.client import Connection
from daemon.display import when
from daemon.rpc.views import GoalView

#: A question's id, as :class:`goals.questions.QuestionId` makes them.
_QUESTION_ID = re.compile(r"^q_[0-9A-HJKMNP-TV-Z]{26}$")


def _question_and_text(words: list[str]) -> tuple[str | None, str | None]:
    """``[QUESTION_ID] TEXT...`` → (question id, text): a first word that is a question's id names it."""
    if words and _QUESTION_ID.match(words[0]):
        return words[0], " ".join(words[1:]) or None
    return None, " ".join(words) or None


async def goal_answer(client: Connection, args: argparse.Namespace) -> int:
    """``goal answer KEY [QUESTION_ID] TEXT`` or ``--option N``."""
    qid, text = _question_and_text(args.words)
    if args.option is None and text is None:
        raise UsageError("usage: goald goal answer GOAL [QUESTION_ID] TEXT  (or --option N)")
    if args.option is not None and text is not None:
        raise UsageError("goal answer: give the answer's TEXT or --option N, not both")
    params: dict[str, Any] = {"goalId": args.goal}
    if qid is not None:
        params["questionId"] = qid
    if args.option is not None:
        params["option"] = args.option
    else:
        params["text"] = text
    done = await client.call("goal/answer", params)
    _print_closed(done, args.json)
    return EXIT_OK


async def goal_withdraw(client: Connection, args: argparse.Namespace) -> int:
    """``goal withdraw KEY [QUESTION_ID] --reason R``."""
    params: dict[str, Any] = {"goalId": args.goal, "withdraw": True, "text": args.reason}
    if args.question is not None:
        params["questionId"] = args.question
    done = await client.call("goal/answer", params)
    _print_closed(done, args.json)
    return EXIT_OK


def _print_closed(done: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(done)
        return
    q, g = done["question"], done["goal"]
    verb = "withdrew" if q["how"] == "withdrawn" else "answered"
    said = f": {q['answer']}" if q["answer"] else ""
    print(f"{verb} {q['id']}{said}")
    going = "goes on now" if done.get("messageId") else f"is {g['status']}"
    print(f"goal {g.get('key') or g['id']} {going}")


async def goal_questions(client: Connection, args: argparse.Namespace) -> int:
    """``goal questions [KEY] [--open]``: newest first."""
    params: dict[str, Any] = {"open": args.open, "limit": args.limit}
    if args.goal is not None:
        params["goalId"] = args.goal
    found = (await client.call("goal/questions", params))["questions"]
    if args.json:
        print_json({"questions": found})
        return EXIT_OK
    if not found:
        print("no open questions" if args.open else "no questions", file=sys.stderr)
        return EXIT_OK
    for q in found:
        print(question_line(q))
    return EXIT_OK


async def goal_revoke(client: Connection, args: argparse.Namespace) -> int:
    """``goal revoke KEY APPROVAL`` or ``--all``: the call is asked about again."""
    if (args.approval is None) == (not args.all):
        raise UsageError("usage: goald goal revoke GOAL APPROVAL  (as goal show lists it), or --all")
    params: dict[str, Any] = {"goalId": args.goal, **({"all": True} if args.all else {"subject": args.approval})}
    g = await client.call("goal/revoke", params)
    if args.json:
        print_json(g)
    else:
        view = GoalView.model_validate(g)
        print(f"goal {view.key or view.id}: {len(view.approvals)} approval(s) left")
    return EXIT_OK


def approval_lines(described: dict[str, Any]) -> list[str]:
    """``goal show``'s standing approvals (calls that run without asking), with how to revoke one."""
    g = GoalView.model_validate(described["goal"])
    found = g.approvals
    if not found:
        return []
    ref = g.key or g.id
    lines = ["approved:   calls that run without asking (goald goal revoke " + ref + " 'APPROVAL' or --all):"]
    lines.extend(f"  {a}" for a in found)
    return lines


def open_question_lines(described: dict[str, Any]) -> list[str]:
    """``goal show``'s lines of the question a waiting goal waits on, with how to answer it."""
    q = described.get("question")
    if not q:
        return []
    g = GoalView.model_validate(described["goal"])
    ref = g.key or g.id
    lines = [f"question:   {q['id']}, asked {when(q['askedAt'])}, open until {when(q['deadline'])}"]
    lines.extend(f"  {line}" for line in str(q["text"]).splitlines())
    if q.get("options"):
        lines.append("  options: " + "  ".join(f"{i}) {o}" for i, o in enumerate(q["options"], 1)))
        lines.append(f"  answer:  goald goal answer {ref} --option N   (or in words: goald goal answer {ref} TEXT)")
    else:
        lines.append(f"  answer:  goald goal answer {ref} TEXT")
    then = f"its default ({q['default']}) is used" if q.get("default") is not None else "the goal pauses"
    lines.append(f"  at the deadline {then}")
    return lines


def question_line(q: dict[str, Any]) -> str:
    """One question in a line or three: id, goal, state, text, options."""
    if q["open"]:
        state = f"open until {when(q['deadline'])}" + (f" (default: {q['default']})" if q.get("default") else "")
    else:
        state = f"{q['how']} by {q['answeredBy']} {when(q['answeredAt'])}" + (
            f": {q['answer']}" if q.get("answer") else ""
        )
    lines = [f"{q['id']}  goal {q['goalId']}  asked {when(q['askedAt'])}  {state}"]
    lines.extend(f"  {line}" for line in str(q["text"]).splitlines())
    if q.get("options"):
        lines.append("  options: " + "  ".join(f"{i}) {o}" for i, o in enumerate(q["options"], 1)))
    return "\n".join(lines)
