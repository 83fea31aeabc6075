"""The status page's questions: the form on a waiting goal's page, the view across goals, and the
pages a signed answer link opens (:mod:`daemon.web.links`).

Every form posts to the daemon's one answer path (``goal/answer``): the first answer wins, and a
later one is refused with who answered first. A link's page is a page of its own: it shows the
question and one button, and nothing else of the daemon.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from daemon.display import when
from daemon.web.html import h, rel


def _options(q: Mapping[str, Any]) -> str:
    return "".join(
        f'<button name="option" value="{i}" class="opt" id="opt-{i}">{h(label)}</button>'
        for i, label in enumerate(q.get("options") or [], 1)
    )


def _deadline(q: Mapping[str, Any]) -> str:
    then = f"its default <b>{h(q['default'])}</b> is used" if q.get("default") is not None else "the goal pauses"
    return f"open until {h(when(q['deadline']))} ({rel(q['deadline'])}); then {then}"


def question_block(q: Mapping[str, Any] | None, gid: str, csrf: str, read_only: bool) -> str:
    """A waiting goal's question with its answer form (options as buttons, an answer in words, a
    withdrawal with a reason); nothing when it waits on none."""
    if not q:
        return ""
    hidden = (
        f'<input type="hidden" name="csrf" value="{h(csrf)}"><input type="hidden" name="question" value="{h(q["id"])}">'
    )
    head = (
        f'<section id="question" data-question="{h(q["id"])}"><h2>Question</h2>'
        f'<p class="qtext" id="question-text">{h(q["text"])}</p><p class="note">{_deadline(q)}</p>'
    )
    if read_only:
        return head + '<p class="note">this token is read-only: it cannot answer</p></section>'
    return (
        head
        + f'<form method="post" action="/goals/{h(gid)}/answer" id="answer-form" class="ans">{hidden}'
        + _options(q)
        + '<input name="text" id="answer-text" placeholder="an answer in your words" size=40>'
        '<button id="btn-answer">answer</button></form>'
        f'<form method="post" action="/goals/{h(gid)}/answer" id="withdraw-form" class="ans">{hidden}'
        '<input type="hidden" name="withdraw" value="1">'
        '<input name="text" id="withdraw-reason" placeholder="why you withdraw it" required size=30>'
        '<button id="btn-withdraw">withdraw</button></form></section>'
    )


def questions_body(questions: list[Mapping[str, Any]], csrf: str, read_only: bool) -> str:
    """``/questions``: the open questions of every goal (each with its form), then the latest closed ones."""
    open_qs = [q for q in questions if q.get("open")]
    closed = [q for q in questions if not q.get("open")][:50]
    parts = [f'<h1>Questions <small id="open-count">{len(open_qs)} open</small></h1>']
    if not open_qs:
        parts.append('<p class="note" id="no-questions">No goal is waiting for an answer.</p>')
    for q in open_qs:
        gid = str(q["goalId"])
        parts.append(
            f'<div class="question" id="q-{h(q["id"])}"><p><a href="/goals/{h(gid)}">{h(gid)}</a>'
            f" asked {h(when(q['askedAt']))}</p>" + question_block(q, gid, csrf, read_only) + "</div>"
        )
    if closed:
        rows = "".join(
            f"<tr><td><a href='/goals/{h(q['goalId'])}'>{h(q['goalId'])}</a></td><td>{h(q['text'])}</td>"
            f"<td>{h(q['how'])}</td><td>{h(q.get('answer') or '')}</td><td>{h(q.get('answeredBy') or '')}</td>"
            f"<td>{h(when(q.get('answeredAt')))}</td></tr>"
            for q in closed
        )
        parts.append(
            "<h2>Closed</h2><table id='closed-questions'><tr><th>goal</th><th>question</th><th>how</th>"
            f"<th>answer</th><th>by</th><th>when</th></tr>{rows}</table>"
        )
    return "".join(parts)


def _standalone(title: str, body: str) -> str:
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>goald: {h(title)}</title></head><body>{body}</body></html>"
    )


def link_page(q: Mapping[str, Any], option: int, closed: str | None) -> str:
    """What a signed link opens: the question, and a button that answers (a GET never answers)."""
    body = f'<h1>A goal asks</h1><p id="question-text">{h(q["text"])}</p>'
    if closed is not None:
        return _standalone("question closed", body + f'<p id="closed">{h(closed)}</p>')
    options = list(q.get("options") or [])
    if option:
        body += (
            '<form method="post" id="link-form">'
            f'<button id="btn-link-answer">answer: {h(options[option - 1])}</button></form>'
        )
    else:
        body += (
            '<form method="post" id="link-form"><input name="text" id="link-text" required size=40'
            ' placeholder="your answer"><button id="btn-link-answer">answer</button></form>'
        )
    return _standalone("answer a question", body + f"<p>{_deadline(q)}</p>")


def link_done(text: str) -> str:
    """The page after a link answered (or was refused)."""
    return _standalone("answer", f'<p id="link-result">{h(text)}</p>')


__all__ = ["link_done", "link_page", "question_block", "questions_body"]
