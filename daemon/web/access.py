"""Who may use the status page, and how a request proves it: the guard every request passes.

Every request needs a token (``?token=`` once, then an HttpOnly, SameSite=Strict cookie; or
``Authorization: Bearer``), else 401 with no data; a read-only token's actions are 403. A
state-changing request must also come from the page itself: an ``Origin`` naming another host, or
``Sec-Fetch-Site`` other than ``same-origin``/``none``, is refused (403), and the form's CSRF token
must match (:meth:`Access.csrf`). Every response gets the headers that keep it out of frames,
caches and other sites' scripts. Nothing is logged per request (a URL may hold a token).

A refused request is answered by a :class:`Refused` page (or JSON for the page's scripts), which
says what to do and shows nothing of the daemon's state.
"""

from __future__ import annotations

import hmac
import math
from collections.abc import Awaitable, Callable
from urllib.parse import urlencode, urlparse

from aiohttp import web

from daemon.errors import DaemonError
from daemon.web import html
from daemon.web.settings import WebSettings
from daemon.web.tokens import TokenFile, WebToken

COOKIE = "goald_web"
#: Where a request keeps the token it was admitted with.
TOKEN_KEY = "goald.web.token"


class Refused(DaemonError):
    """A request answered with an error page (or JSON for the page's scripts)."""

    def __init__(self, status: int, title: str, text: str) -> None:
        super().__init__(text)
        self.status, self.title, self.text = status, title, text


class Access:
    """The middleware that admits a request by its token (or refuses it), and the CSRF check of a form."""

    def __init__(self, tokens: TokenFile, settings: WebSettings) -> None:
        self.tokens = tokens
        self.settings = settings

    def _who(self, request: web.Request) -> WebToken | None:
        cookie = request.cookies.get(COOKIE)
        if cookie:
            token = self.tokens.by_cookie(cookie)
            if token is not None:
                return token
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return self.tokens.check(auth[7:].strip())
        return None

    @web.middleware
    async def guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            resp = await self._admit(request, handler)
        except Refused as exc:
            resp = self._refusal(request, exc)
        except web.HTTPException as exc:
            resp = self._refusal(request, Refused(exc.status, exc.reason, exc.text or exc.reason))
        if not resp.prepared:
            resp.headers.setdefault("Cache-Control", "no-store")
            resp.headers["X-Content-Type-Options"] = "nosniff"
            resp.headers["X-Frame-Options"] = "DENY"
            resp.headers["Referrer-Policy"] = "no-referrer"
            resp.headers["Content-Security-Policy"] = (
                "default-src 'self'; img-src 'self'; style-src 'self' 'unsafe-inline'; script-src 'self';"
                " connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
            )
        return resp

    async def _admit(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path.startswith("/answer/"):
            # A signed answer link is its own capability (daemon.web.links), checked by its handler
            # before anything is read; it needs no page token and gets no cookie.
            return await handler(request)
        given = request.query.get("token")
        if given is not None:
            token = self.tokens.check(given)
            if token is None:
                raise Refused(401, "Unauthorized", "This token is not known (removed, or mistyped).")
            # Once: the cookie stands for it from now on, and the token leaves the address bar.
            rest = {k: v for k, v in request.query.items() if k != "token"}
            resp = see_other(request.path + (f"?{urlencode(rest)}" if rest else ""))
            resp.set_cookie(
                COOKIE,
                token.cookie,
                httponly=True,
                samesite="Strict",
                secure=self.settings.secure_cookie,
                path="/",
                max_age=30 * 86400,
            )
            return resp
        token = self._who(request)
        if token is None:
            raise Refused(
                401,
                "Unauthorized",
                "The status page needs a token: `goald web token add NAME` prints one; open the page once"
                " with ?token=... and a cookie keeps you signed in.",
            )
        if request.method not in ("GET", "HEAD"):
            self._same_origin(request, token)
        request[TOKEN_KEY] = token
        return await handler(request)

    def _same_origin(self, request: web.Request, token: WebToken) -> None:
        site = request.headers.get("Sec-Fetch-Site")
        if site is not None and site not in ("same-origin", "none"):
            raise Refused(403, "Forbidden", f"a {site} request cannot change anything here")
        origin = request.headers.get("Origin")
        # A plain form post under this page's no-referrer policy says ``Origin: null``; the browser's
        # own Sec-Fetch-Site (no page can set it) then says whether it came from this site.
        opaque = origin == "null" and site != "same-origin"
        if origin is not None and (opaque or (origin != "null" and urlparse(origin).netloc != request.host)):
            raise Refused(403, "Forbidden", "a request from another site cannot change anything here")
        if token.read_only:
            raise Refused(403, "Forbidden", f"the token {token.name!r} is read-only")

    async def csrf(self, request: web.Request, token: WebToken) -> dict[str, str]:
        form = {k: str(v) for k, v in (await request.post()).items()}
        sent = request.headers.get("X-CSRF-Token") or form.get("csrf", "")
        if not hmac.compare_digest(sent, token.csrf):
            raise Refused(403, "Forbidden", "the form's CSRF token is missing or wrong: reload the page")
        return form

    def _refusal(self, request: web.Request, exc: Refused) -> web.Response:
        if wants_json(request):
            return web.json_response({"error": exc.text}, status=exc.status)
        return web.Response(
            text=html.refusal(exc.status, exc.title, exc.text), status=exc.status, content_type="text/html"
        )


def token_of(request: web.Request) -> WebToken:
    token = request[TOKEN_KEY]
    assert isinstance(token, WebToken)  # set by the guard before any handler runs
    return token


def see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def wants_json(request: web.Request) -> bool:
    return "application/json" in request.headers.get("Accept", "")


def query_int(raw: str | None, default: int, *, minimum: int = 0, maximum: int | None = None) -> int:
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise Refused(400, "Bad request", f"{raw!r} is not a whole number") from None
    if value < minimum or (maximum is not None and value > maximum) or math.isinf(value):
        raise Refused(400, "Bad request", f"{value} is out of range")
    return value
