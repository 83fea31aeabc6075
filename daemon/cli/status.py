"""``goald status``: the daemon's health in the words an operator looks for.

What runs (version, PID, state, uptime), where (config file, state directory, database and its
size — on PostgreSQL the URL without its password — socket), goals by status, each provider's state
(``ok``; ``failing (N in a row, last: ...)`` while its calls fail; ``open`` while its circuit
breaker makes calls wait, with when it probes and who waits), its models' windows,
the cluster's nodes when daemons share a PostgreSQL database (:mod:`daemon.cli.node`), and the next
schedule fire.
"""

from __future__ import annotations

import argparse
from typing import Any

from daemon.cli.node import cluster_lines
from daemon.cli.parser import EXIT_OK, print_json
from daemon.client import Connection
from daemon.display import age, provider_words, use_utc, when, window_text
from goals.why import span


def size_text(n: int) -> str:
    """Bytes in a few characters (``12.3 MiB``)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover - the loop returns


def status_lines(health: dict[str, Any]) -> list[str]:
    """``daemon/health`` as lines."""
    h = health
    out = [f"goald {h['version']}  pid {h.get('pid', '-')}  {h['status']}, up {span(h['uptimeSeconds'])}"]
    out.append(f"config:    {h.get('configPath') or 'none (built-in defaults)'}")
    out.append(f"state dir: {h.get('stateDir', '-')}")
    if h.get("databasePath"):
        size = size_text(int(h["databaseBytes"])) if h.get("databaseBytes") is not None else "size unknown"
        if h.get("store") == "postgresql":
            reach = ""
            if h.get("storeConnections") is not None:
                reach = f", {h['storeConnections']} connections, {h.get('storeRoundTrips') or 0:,} round trips"
                if h.get("storeReruns"):
                    reach += f", {h['storeReruns']:,} writes run again (their session changed meanwhile)"
            out.append(f"store:     PostgreSQL {h['databasePath']} ({size}{reach})")
        else:
            out.append(f"database:  {h['databasePath']} ({size})")
    if h.get("socketPath"):
        out.append(f"socket:    {h['socketPath']}")
    goals = ", ".join(f"{v} {k}" for k, v in (h.get("goals") or {}).items() if v)
    out.append(f"goals:     {goals or 'none'}; sessions running: {h['sessionsRunning']}")
    slots = h.get("slots") or {}
    if slots:
        out.append(f"slots:     {slots['inUse']} of {slots['max']} in use, {slots['waiting']} turn(s) waiting for one")
    storage = h.get("storage") or {}
    if storage and not storage.get("ok", True):
        out.append(f"storage:   FAILING: {storage.get('error') or storage}")
    providers = h.get("providers") or {}
    if providers:
        out.append("providers:")
        for name, p in sorted(providers.items()):
            out.append(f"  {provider_line(name, p)}")
            out.extend(f"    {window_line(model, w)}" for model, w in sorted((p.get("models") or {}).items()))
    else:
        out.append("providers: none with a circuit (scripted models only)")
    out.extend(cluster_lines(h.get("cluster")))
    nxt = h.get("nextFire")
    if nxt and nxt.get("at"):
        who = nxt.get("key") or nxt["scheduleId"]
        out.append(f"next fire: {who} at {when(nxt['at'])} ({age(nxt['at'])})")
    else:
        out.append("next fire: none scheduled")
    return out


async def status(client: Connection, args: argparse.Namespace) -> int:
    use_utc(getattr(args, "utc", False))
    health = await client.call("daemon/health")
    if args.json:
        print_json(health)
    else:
        print("\n".join(status_lines(health)))
    return EXIT_OK


def window_line(model: str, window: dict[str, Any]) -> str:
    """A model in use: its context window and where the figure came from (config, a server's word...)."""
    return f"{model}: context window {window_text(window)}"


def provider_line(name: str, snapshot: dict[str, Any]) -> str:
    """One provider's health in a few words: ``ok``, ``failing (N in a row, last: ...)``, or ``open``
    with when it probes, who waits on it and its last error."""
    breaker = snapshot.get("breaker") or {}
    state = str(snapshot.get("state", "unknown"))
    parts = []
    if state != "closed":
        if breaker.get("retryIn") is not None:
            parts.append(f"probe in {breaker['retryIn']:.0f}s")
        parts.append(f"{breaker.get('waiting', 0)} call(s) waiting")
        if snapshot.get("lastError"):
            parts.append(f"last error: {str(snapshot['lastError'])[:120]}")
    return f"{name} {provider_words(snapshot)}" + (f"; {'; '.join(parts)}" if parts else "")


async def reload(client: Connection, args: argparse.Namespace) -> int:
    """``goald reload``: ``daemon/reload`` (what SIGHUP does), saying what it applied."""
    done = await client.call("daemon/reload")
    if args.json:
        print_json(done)
    else:
        print(f"reloaded: {done['goals']} goal(s) and {done['schedules']} schedule(s) applied from the goals file")
    return 0
