"""The status page's answer routes: the form of a waiting goal's page, ``/questions``, and the signed
links of question notifications (``/answer/<token>``).

The form and ``/questions`` pass the page's guard like every route (a token; the CSRF token and the
same-origin check for the form's POST) and answer as the token (``"web": NAME``). ``/answer/``
does not take the page's token: the link's own token is its capability (:mod:`daemon.web.links`),
checked before anything is read; it answers as ``link`` and opens nothing else.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from aiohttp import web
from loguru import logger

from daemon.web.access import Access, Refused, see_other, token_of, wants_json
from daemon.web.links import AnswerLinks, LinkRefused
from daemon.web.questions_view import link_done, link_page, questions_body
from goals import GoalEngine
from goals.errors import GoalError
from goals.questions import QuestionClosed, closed_text

#: The prefix of the signed links' routes (the page's guard lets them through to their own check).
LINK_PREFIX = "/answer/"
#: The words an answer through a link is recorded with (``answered_by``).
LINK_CALLER = {"link": "signed link"}

Call = Callable[[web.Request, str, dict[str, Any] | None], Awaitable[Any]]
Page = Callable[[web.Request, str, str, str], web.Response]


class AnswerRoutes:
    """The routes; ``call`` and ``page`` are the status page's (a method as the request's token, a
    page in its layout)."""

    def __init__(
        self, access: Access, call: Call, page: Page, engine: Callable[[], GoalEngine | None], links: AnswerLinks
    ) -> None:
        self.access = access
        self.call = call
        self.page = page
        self.engine = engine
        self.links = links

    def routes(self) -> list[web.RouteDef]:
        """Its routes, for the application."""
        return [
            web.post("/goals/{ref}/answer", self.form),
            web.get("/questions", self.listing),
            web.get(LINK_PREFIX + "{token}", self.link_get),
            web.post(LINK_PREFIX + "{token}", self.link_post),
        ]

    async def form(self, request: web.Request) -> web.StreamResponse:
        """The goal page's answer (an option's button, words) or withdrawal (with a reason)."""
        token = token_of(request)
        form = await self.access.csrf(request, token)
        params: dict[str, Any] = {"goalId": request.match_info["ref"]}
        if form.get("question"):
            params["questionId"] = form["question"]
        if form.get("withdraw"):
            params.update(withdraw=True, text=form.get("text", "").strip() or None)
        elif form.get("option"):
            try:
                params["option"] = int(form["option"])
            except ValueError:
                raise Refused(400, "Bad request", f"option {form['option'][:20]!r} is not a number") from None
        else:
            text = form.get("text", "").strip()
            if not text:
                raise Refused(400, "Bad request", "the answer is empty: pick an option or write an answer")
            params["text"] = text
        result = await self.call(request, "goal/answer", params)
        done = "withdrawn" if params.get("withdraw") else "answered"
        goal_id = str(result["goal"]["id"])
        logger.info("web: question {} of goal {} {} by token {}", result["question"]["id"], goal_id, done, token.name)
        if wants_json(request):
            return web.json_response({"ok": True, "action": "answer", "result": result})
        return see_other(f"/goals/{goal_id}?{urlencode({'done': done})}")

    async def listing(self, request: web.Request) -> web.Response:
        """``/questions``: every goal's open questions with their forms, then the latest closed ones."""
        found = await self.call(request, "goal/questions", {"limit": 200})
        token = token_of(request)
        body = questions_body(list(found.get("questions") or []), token.csrf, token.read_only)
        return self.page(request, "Questions", body, "questions")

    def _engine(self) -> GoalEngine:
        engine = self.engine()
        if engine is None:
            raise Refused(503, "Unavailable", "the daemon is not serving")
        return engine

    async def _linked(self, request: web.Request) -> tuple[str, int, Any]:
        try:
            qid, option = self.links.check(request.match_info["token"])
        except LinkRefused as exc:
            raise Refused(403, "Forbidden", str(exc)) from None
        try:
            q = await self._engine().question(qid)
        except GoalError:
            raise Refused(404, "Not found", "this question is gone (its goal was deleted)") from None
        if option > len(q.options):
            raise Refused(403, "Forbidden", "this answer link is not valid")
        return qid, option, q

    async def link_get(self, request: web.Request) -> web.Response:
        """A link opened: the question and a button (a GET never answers: previews fetch links)."""
        _qid, option, q = await self._linked(request)
        closed = None if q.open else closed_text(q)
        return web.Response(text=link_page(q.public(), option, closed), content_type="text/html")

    async def link_post(self, request: web.Request) -> web.Response:
        """A link's button (or an ntfy action): answers once; a closed question says who answered first."""
        qid, option, q = await self._linked(request)
        text = None
        if option == 0:
            text = str((await request.post()).get("text", "")).strip()
            if not text:
                raise Refused(400, "Bad request", "the answer is empty")
        try:
            goal, _ = await self._engine().answer(q.goal_id, qid, text, option=option or None, caller=LINK_CALLER)
        except QuestionClosed as exc:
            raise Refused(409, "Conflict", str(exc)) from None
        answer = q.options[option - 1] if option else text
        logger.info("web: question {} of goal {} answered through its signed link", qid, goal.id)
        said = f"Answered: {answer}. The goal goes on."
        if wants_json(request):
            return web.json_response({"ok": True, "questionId": qid, "answer": answer})
        return web.Response(text=link_done(said), content_type="text/html")


__all__ = ["LINK_CALLER", "LINK_PREFIX", "AnswerRoutes"]
