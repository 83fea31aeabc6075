"""The status page: goals, budgets burning down, each round on a timeline, live.

- :mod:`~daemon.web.settings`: ``[web]`` (where it listens; a non-loopback address needs ``allow_remote``).
- :mod:`~daemon.web.tokens`: named tokens, stored hashed; the cookie and CSRF values derived from them.
- :mod:`~daemon.web.listen`: binding the listeners at start.
- :mod:`~daemon.web.access`: the guard every request passes (token, same origin, CSRF) and refusals.
- :mod:`~daemon.web.app`: the aiohttp server on the daemon's loop and its page handlers.
- Server-rendered HTML: :mod:`~daemon.web.html` (escaping, the frame, budget bars),
  :mod:`~daemon.web.goals_view` (the goals table), :mod:`~daemon.web.goal_view` (one goal),
  :mod:`~daemon.web.timeline_view` (bands, entries, a band's conversation),
  :mod:`~daemon.web.system_view` (the schedules and daemon pages).
- :mod:`~daemon.web.timeline`: rounds as bands, paged by sequence number; :mod:`~daemon.web.charts`:
  the burn-down SVG; :mod:`~daemon.web.live`: server-sent events from the committed-event subscription.
- ``static/``: the little JavaScript and CSS the page uses (shipped in the package, nothing fetched).

This ``__init__`` imports only the settings (the configuration reads them whether the page is on
or not); the server and aiohttp load when ``[web]`` is enabled.
"""

from __future__ import annotations

from daemon.web.settings import WebSettings

__all__ = ["WebSettings"]
