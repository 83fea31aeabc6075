"""``goald status``: the daemon's health, and each provider's in a few words."""

from __future__ import annotations

import argparse
from typing import Any

from daemon.cli.goal import print_json
from daemon.cli.parser import EXIT_OK
from daemon.client import Connection


async def status(client: Connection, args: argparse.Namespace) -> int:
    health = await client.call("daemon/health")
    if args.json:
        print_json(health)
    else:
        goals = ", ".join(f"{k} {v}" for k, v in health["goals"].items() if v)
        print(f"goald {health['version']}: {health['status']}, up {health['uptimeSeconds']:.0f}s")
        print(f"goals: {goals or 'none'}; sessions running: {health['sessionsRunning']}")
        providers = health.get("providers") or {}
        if providers:
            print("providers: " + "; ".join(provider_line(name, p) for name, p in sorted(providers.items())))
    return EXIT_OK


def provider_line(name: str, snapshot: dict[str, Any]) -> str:
    """One provider's health in a few words: its breaker, and who waits on it while it is open."""
    breaker = snapshot.get("breaker") or {}
    state = str(snapshot.get("state", "unknown")).replace("_", "-")
    text = f"{name} {state}"
    if state == "closed":
        failures = breaker.get("consecutiveFailures") or 0
        return text + (f" ({failures} failure(s) in a row)" if failures else "")
    parts = []
    if breaker.get("retryIn") is not None:
        parts.append(f"probe in {breaker['retryIn']:.0f}s")
    parts.append(f"{breaker.get('waiting', 0)} call(s) waiting")
    if snapshot.get("lastError"):
        parts.append(f"last error: {str(snapshot['lastError'])[:80]}")
    return f"{text} ({', '.join(parts)})"
