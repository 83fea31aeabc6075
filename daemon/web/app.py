"""The status page's server: routes, access control, and its place in the daemon.

Choices, and why:

- **aiohttp's server**, on the daemon's own event loop (no second process, no thread): it is
  asyncio-native, small and long maintained, listens on TCP and unix sockets alike, and streams
  responses (server-sent events, :mod:`daemon.web.live`). It is imported only when ``[web]`` is
  enabled, so a daemon without the page does not load it.
- **The same methods as the socket**: every read and every action goes through the control
  protocol's :class:`~daemon.rpc.protocol.Dispatcher` in-process (``goal/list``, ``goal/describe``,
  ``goal/pause``, ``session/prompt``...), with a :class:`WebPeer` whose caller is the token's name,
  so the page shows what ``goald`` shows and an action is recorded like one from the socket
  (``"web": NAME`` where the socket records ``uid`` and ``pid``).
- **Access** (:mod:`daemon.web.access`): a token for every request, a same-origin check and the
  CSRF token for every action; this module only names the guard as the application's middleware.
- **Bounded work per request**: the goals table is paged after sorting, the timeline is a page of
  bands by sequence number (``goal/timeline``, :mod:`daemon.rpc.timeline`), the burn-down chart is
  cached and extended (:mod:`daemon.web.charts`), a band's conversation is read on demand with a
  cap (``session/events``). The goal page's node is ``goal/describe``'s.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable
from importlib import resources
from typing import Any
from urllib.parse import urlencode

from aiohttp import web
from loguru import logger

from agent import Runtime
from daemon.display import status_text
from daemon.metrics import LoopLag
from daemon.ports import HostPort
from daemon.rpc.protocol import Dispatcher, ErrorCode, Peer, map_exception
from daemon.rpc.views import GoalView
from daemon.web.access import Access, Refused, query_int, see_other, token_of, wants_json
from daemon.web.answers import AnswerRoutes
from daemon.web.charts import BurnCache, burn_svg
from daemon.web.goal_view import goal_page
from daemon.web.goals_view import attention_order, goal_row, goals_page
from daemon.web.html import h, layout, now_utc, used_text
from daemon.web.links import AnswerLinks
from daemon.web.listen import describe
from daemon.web.live import Streams, goal_stream, goals_stream
from daemon.web.settings import WebSettings
from daemon.web.system_view import daemon_page, schedules_page
from daemon.web.timeline_view import conversation as conversation_html
from daemon.web.timeline_view import timeline_html, timeline_section
from daemon.web.tokens import TokenFile

PER_PAGE = 100
BANDS_PER_PAGE = 10
CONVERSATION_LIMIT = 500
STATIC = {"app.js": "text/javascript", "style.css": "text/css"}
HTTP_OF = {
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.INVALID_PARAMS: 400,
    ErrorCode.INVALID_TRANSITION: 409,
    ErrorCode.CONFLICT: 409,
    ErrorCode.SHUTTING_DOWN: 503,
    ErrorCode.STORAGE_UNAVAILABLE: 503,
}


@dataclasses.dataclass
class WebPeer(Peer):
    """The page's caller on the control protocol: the token's name stands where the socket puts uid and pid."""

    token_name: str = ""

    @property
    def caller(self) -> dict[str, int | str]:
        """``{"web": NAME}``, recorded in the events an action writes (as ``uid``/``pid`` are for the socket)."""
        # The events keep whatever the caller holds (their payloads read unknown keys as extra);
        # the protocol types the mapping's values as the socket's ints.
        return {"web": self.token_name}


async def _nothing(msg: dict[str, Any]) -> None:
    return None


class WebService:
    """The status page, started and stopped by the host with the control socket."""

    def __init__(
        self, host: HostPort, dispatcher: Dispatcher, settings: WebSettings, sockets: list[socket.socket]
    ) -> None:
        self.host = host
        self.sockets = sockets
        self.dispatcher = dispatcher
        self.settings = settings
        self.tokens = TokenFile(settings.tokens_path(host.settings.state_dir))
        self.access = Access(self.tokens, settings)
        self.streams = Streams(settings.max_live_pages)
        self.lag = LoopLag()
        self._burn: BurnCache | None = None
        links = AnswerLinks(host.settings.state_dir, settings.base_url())
        self.answers = AnswerRoutes(self.access, self.call, self._page, lambda: host.engine, links)
        self._runner: web.AppRunner | None = None
        self._lag_task: Any = None
        #: Where it listens (``http://HOST:PORT`` and/or ``unix:PATH``), once started.
        self.addresses: list[str] = []

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, spawn: Callable[[Any], Any]) -> None:
        """Serve on the sockets bound at start (:func:`~daemon.web.listen.bind_listeners`)."""
        app = web.Application(middlewares=[self.access.guard], client_max_size=256 * 1024)
        app.add_routes(
            [
                web.get("/", self.goals),
                web.get("/live", self.goals_live),
                web.get("/goals/{ref}", self.goal),
                web.get("/goals/{ref}/timeline", self.timeline),
                web.get("/goals/{ref}/conversation", self.conversation),
                web.get("/goals/{ref}/diff", self.diff),
                web.get("/goals/{ref}/burn.svg", self.burn),
                web.get("/goals/{ref}/live", self.live),
                web.get("/goals/{ref}/state", self.state),
                web.post("/goals/{ref}/{action:pause|resume|cancel|send}", self.act),
                web.get("/schedules", self.schedules),
                web.get("/daemon", self.daemon),
                web.get("/static/{name}", self.static),
                *self.answers.routes(),
            ]
        )
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0, handle_signals=False)
        await self._runner.setup()
        for sock in self.sockets:
            await web.SockSite(self._runner, sock).start()
            self.addresses.append(describe(sock))
        self._lag_task = spawn(self.lag.run())
        logger.info("status page on {} (tokens in {})", ", ".join(self.addresses), self.tokens.path)

    async def stop(self) -> None:
        """Close the live pages, then the listeners."""
        await self.streams.close_all()
        if self._lag_task is not None:
            self._lag_task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- calls -------------------------------------------------------------------------------

    async def call(self, request: web.Request, method: str, params: dict[str, Any] | None = None) -> Any:
        """One control-protocol method, in-process, as the request's token."""
        token = token_of(request)
        peer = WebPeer(send=_nothing, token_name=token.name)
        try:
            return await self.dispatcher.call(method, params or {}, peer)
        except Exception as exc:
            err = map_exception(exc)
            status = HTTP_OF.get(ErrorCode(err.code), 500) if err.code in set(ErrorCode) else 500
            raise Refused(status, "Refused" if status < 500 else "Unavailable", err.message) from None

    def _rt(self) -> Runtime:
        if self.host.rt is None:
            raise Refused(503, "Unavailable", "the daemon is not serving")
        return self.host.rt

    def _page(self, request: web.Request, title: str, body: str, page: str, extra: str = "") -> web.Response:
        token = token_of(request)
        html = layout(title, body, page=page, token=token.name, read_only=token.read_only, csrf=token.csrf, extra=extra)
        return web.Response(text=html, content_type="text/html")

    # -- pages -------------------------------------------------------------------------------

    async def goals(self, request: web.Request) -> web.Response:
        """The goals table, by attention, filtered and paged."""
        status = request.query.get("status") or None
        schedule = request.query.get("schedule") or None
        page = query_int(request.query.get("page"), 1, minimum=1)
        params = {k: v for k, v in (("status", status), ("schedule", schedule)) if v}
        listing = await self.call(request, "goal/list", params)
        ordered = attention_order([GoalView.model_validate(g) for g in listing.get("goals") or []])
        shown = ordered[(page - 1) * PER_PAGE : page * PER_PAGE]  # in a cluster each has its node
        body = goals_page(shown, status=status, schedule=schedule, page=page, per_page=PER_PAGE, total=len(ordered))
        return self._page(request, "Goals", body, "goals")

    async def goals_live(self, request: web.Request) -> web.StreamResponse:
        """The goals table's live stream: each moved goal's row, re-rendered (server-sent events)."""
        if self.streams.full():
            raise Refused(503, "Busy", f"{self.streams.cap} live pages are open already (web.max_live_pages)")
        listing = await self.call(request, "goal/list", {})
        listed = [GoalView.model_validate(g) for g in listing.get("goals") or []]
        sessions: dict[str, str] = {g.session_id: g.id for g in listed}

        async def row(goal_id: str) -> str | None:
            try:
                d = await self.call(request, "goal/describe", {"goalId": goal_id, "events": 0})
            except Refused:
                return None  # deleted since
            g = GoalView.model_validate({**d["goal"], **({"node": d["node"]} if "node" in d else {})})
            sessions.setdefault(g.session_id, goal_id)
            return goal_row(g)

        return await goals_stream(request, hub=self._rt().store.hub, sessions=sessions, row=row, streams=self.streams)

    async def goal(self, request: web.Request) -> web.Response:
        """One goal: describe data, actions, chart, the newest bands of its timeline."""
        d = await self.call(request, "goal/describe", {"goalId": request.match_info["ref"], "events": 0})
        g = GoalView.model_validate(d["goal"])
        tl = await self.call(request, "goal/timeline", {"goalId": g.id, "limit": BANDS_PER_PAGE})
        flash = request.query.get("done")
        body = goal_page(
            d,
            timeline_section(g.id, tl, diffs=g.repo is not None),
            csrf=token_of(request).csrf,
            read_only=token_of(request).read_only,
            last_seq=int(tl.get("lastSeq") or 0),
            flash=f"{flash}: done" if flash else None,
        )
        return self._page(request, g.title, body, "goal")

    async def timeline(self, request: web.Request) -> web.Response:
        """Older bands (a fragment for the page's script, or a page of its own without it)."""
        g = await self._goal(request, request.match_info["ref"])
        before = query_int(request.query.get("before"), 2**62, minimum=1)
        count = query_int(request.query.get("limit"), BANDS_PER_PAGE, minimum=1, maximum=100)
        tl = await self.call(request, "goal/timeline", {"goalId": g.id, "before": before, "limit": count})
        html = timeline_html(g.id, tl, diffs=g.repo is not None)
        if request.headers.get("X-Fragment"):
            return web.Response(text=html, content_type="text/html")
        body = f'<h1><a href="/goals/{h(g.id)}">{h(g.title)}</a>: older rounds</h1>{html}'
        return self._page(request, "Timeline", body, "goal")

    async def diff(self, request: web.Request) -> web.Response:
        """What a goal on a repository changed: since its start, or in one round (``?round=N``)."""
        g = await self._goal(request, request.match_info["ref"])
        params: dict[str, Any] = {"goalId": g.id}
        if "round" in request.query:
            params["round"] = query_int(request.query.get("round"), 1, minimum=1)
        d = await self.call(request, "goal/diff", params)
        what = f"round {params['round']}" if "round" in params else "since its start"
        stat = "".join(
            f"<tr><td><code>{h(f['path'])}</code></td><td>{h(f['status'])}</td>"
            f"<td>+{h(f['added'] if f['added'] is not None else '-')}</td>"
            f"<td>-{h(f['removed'] if f['removed'] is not None else '-')}</td></tr>"
            for f in d["files"]
        )
        body = (
            f'<h1><a href="/goals/{h(g.id)}">{h(g.title)}</a>: what it changed, {h(what)}</h1>'
            f'<p class="note">{h(d["from"])} → {h(d["to"])}</p><table id="diff-files">{stat}</table>'
            f'<pre id="diff-text">{h(d["text"]) or "no change"}</pre>'
        )
        return self._page(request, "Changes", body, "goal")

    async def conversation(self, request: web.Request) -> web.Response:
        """One band's conversation (at most ``CONVERSATION_LIMIT`` events)."""
        g = await self._goal(request, request.match_info["ref"])
        after = query_int(request.query.get("after"), 0, minimum=0)
        upto = query_int(request.query.get("upto"), after + CONVERSATION_LIMIT, minimum=after)
        limit = max(1, min(upto - after, CONVERSATION_LIMIT))
        page = await self.call(
            request, "session/events", {"sessionId": g.session_id, "afterSeq": after, "limit": limit}
        )
        html = conversation_html([e for e in page.get("events") or [] if int(e["seq"]) <= upto])
        if request.headers.get("X-Fragment"):
            return web.Response(text=html, content_type="text/html")
        return self._page(request, "Conversation", f"<h1>{h(g.title)}: conversation</h1>{html}", "goal")

    async def burn(self, request: web.Request) -> web.Response:
        """The burn-down chart (SVG)."""
        g = await self._goal(request, request.match_info["ref"])
        if self._burn is None:
            self._burn = BurnCache(self._rt().store)
        series = await self._burn.series(g.id, g.session_id)
        start = g.created_at.timestamp()
        end = g.updated_at.timestamp() if not g.status.live else None
        svg = burn_svg(
            series,
            max_tokens=g.budgets.max_tokens_total,
            max_cost=g.budgets.max_cost,
            start=start,
            now=end or now_utc().timestamp(),
        )
        return web.Response(text=svg, content_type="image/svg+xml")

    async def state(self, request: web.Request) -> web.Response:
        """The goal's status and counters as JSON (what a live page refreshes)."""
        return web.json_response(await self._summary(request, request.match_info["ref"]))

    async def _goal(self, request: web.Request, ref: str) -> GoalView:
        """The goal ``ref`` names (a key, an id or a prefix), typed."""
        return GoalView.model_validate(await self.call(request, "goal/get", {"goalId": ref}))

    async def _summary(self, request: web.Request, ref: str) -> dict[str, Any]:
        d = await self.call(request, "goal/describe", {"goalId": ref, "events": 0})
        g = GoalView.model_validate(d["goal"])
        b = g.budgets
        return {
            "id": g.id,
            "status": g.status.value,
            "statusText": status_text(g),
            "why": d.get("why") or "-",
            "activity": (d.get("activity") or {}).get("text"),
            "rounds": used_text(float(g.rounds), b.max_rounds, "{:,.0f}"),
            "tokens": used_text(float(g.tokens), b.max_tokens_total, "{:,.0f}"),
            "cost": used_text(g.cost, b.max_cost, "{:.4f}"),
        }

    async def live(self, request: web.Request) -> web.StreamResponse:
        """The goal's live stream (server-sent events), from ``Last-Event-ID`` or ``after``."""
        ref = request.match_info["ref"]
        g = await self._goal(request, ref)
        if self.streams.full():
            raise Refused(503, "Busy", f"{self.streams.cap} live pages are open already (web.max_live_pages)")
        resume = request.headers.get("Last-Event-ID")
        after = query_int(resume, 0, minimum=0) if resume else query_int(request.query.get("after"), 0, minimum=0)
        rt = self._rt()

        async def summary() -> dict[str, Any]:
            try:
                return await self._summary(request, g.id)
            except Refused as exc:
                return {"error": exc.text}

        return await goal_stream(
            request,
            store=rt.store,
            hub=rt.store.hub,
            session_id=g.session_id,
            after=after,
            backlog=self.settings.live_backlog,
            summary=summary,
            streams=self.streams,
            goal_id=g.id,
        )

    async def act(self, request: web.Request) -> web.StreamResponse:
        """Pause, resume, cancel, or send a message: the socket's methods, recorded with the token's name."""
        token = token_of(request)
        form = await self.access.csrf(request, token)
        ref, action = request.match_info["ref"], request.match_info["action"]
        if action == "send":
            text = form.get("text", "").strip()
            if not text:
                raise Refused(400, "Bad request", "the message is empty")
            g = await self._goal(request, ref)
            params: dict[str, Any] = {"sessionId": g.session_id, "text": text}
            if form.get("resume"):
                params["resume"] = True
            result = await self.call(request, "session/prompt", params)
            goal_id = str(g.id)
        else:
            result = await self.call(request, f"goal/{action}", {"goalId": ref})
            goal_id = str(result.get("id"))
        logger.info("web: {} {} by token {}", action, goal_id, token.name)
        if wants_json(request):
            return web.json_response({"ok": True, "action": action, "result": result})
        return see_other(f"/goals/{goal_id}?{urlencode({'done': action})}")

    async def schedules(self, request: web.Request) -> web.Response:
        """Schedules with their next fires and last runs."""
        listing = await self.call(request, "schedule/list")
        schedules = list(listing.get("schedules") or [])[:200]
        runs: dict[str, list[dict[str, Any]]] = {}
        for s in schedules:
            got = await self.call(request, "schedule/runs", {"scheduleId": s["id"], "limit": 5})
            runs[str(s["id"])] = list(got.get("runs") or [])
        return self._page(request, "Schedules", schedules_page(schedules, runs), "schedules")

    async def daemon(self, request: web.Request) -> web.Response:
        """The daemon's health."""
        health = await self.call(request, "daemon/health")
        body = daemon_page(health, loop_lag=self.lag.take_max(), live_pages=len(self.streams.open))
        return self._page(request, "Daemon", body, "daemon")

    async def static(self, request: web.Request) -> web.Response:
        """The page's own script and style (shipped in the package)."""
        name = request.match_info["name"]
        if name not in STATIC:
            raise Refused(404, "Not found", f"no file {name!r}")
        data = resources.files("daemon.web").joinpath("static", name).read_bytes()
        return web.Response(body=data, content_type=STATIC[name], headers={"Cache-Control": "private, max-age=300"})
