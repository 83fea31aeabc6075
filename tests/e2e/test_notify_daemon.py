"""Notifications through the real daemon: every kind arrives at least once, through failing attempts and
a real ``kill -9``; an id arrives twice only when the kill fell between a delivery and its record; one
401 that pauses many goals is one message with the count; ``goald notify test``; bad config.

The webhook is the test's own server on 127.0.0.1 (``tests/webhook_server.py``); the daemon is
``goald serve`` as a process, its goals run the shipped scripted test models, and the provider that
fails is the local OpenAI-compatible server of ``tests/providers_server.py``. The test reads the
daemon's database file (read-only) only to list every notification the daemon committed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from harness import TEST_MODELS, Daemon, rpc, toml_text, wait_goal
from providers_server import ProviderServer, Respond, openai_text
from webhook_server import Received, WebhookServer, fail_first

ALL_KINDS = {
    "goal_completed",
    "goal_exhausted",
    "goal_failed",
    "goal_cancelled",
    "goal_paused",
    "schedule_missed",
    "schedule_error",
    "breaker_opened",
    "breaker_closed",
}


def notify_conf(hook: WebhookServer, **kw: Any) -> dict[str, Any]:
    return {
        "sinks": [{"type": "webhook", "name": "ops", "url": f"{hook.url}/ops"}],
        "retry_first_seconds": 0.05,
        "retry_max_seconds": 0.3,
        "group_window_seconds": 0.5,
        # The receiver is down for a while in these tests: no delivery gives up meanwhile.
        "max_attempts": 10_000,
        **kw,
    }


def committed_ids(state: Path) -> dict[str, str]:
    """Every notification the daemon committed: id → kind (read-only, beside the running daemon)."""
    conn = sqlite3.connect(f"file:{state / 'goald.db'}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT id, kind FROM outbox").fetchall())
    finally:
        conn.close()


def carried(hook: WebhookServer) -> Counter[str]:
    """How many accepted deliveries carried each notification id (a grouped message carries several)."""
    return Counter(i for r in hook.accepted() for i in r.json["ids"])


def write_config(d: Daemon, providers: dict[str, Any], notify: dict[str, Any]) -> None:
    # Sinks are an array of tables; the harness writes tables only, so the list goes in by JSON-ish TOML.
    text_notify = {k: v for k, v in notify.items() if k != "sinks"}
    config = {"state_dir": str(d.state_dir), "log_level": "DEBUG", "providers": providers, "notify": text_notify}
    d.config_path.write_text(toml_text(config))
    sinks = "".join(
        "[[notify.sinks]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in s.items()) for s in notify["sinks"]
    )
    d.config_path.write_text(d.config_path.read_text() + sinks)


async def add_goal(d: Daemon, objective: str, *args: str) -> str:
    goal = await d.acli_json("goal", "add", objective, *args)
    return str(goal["goalId"])


async def test_every_kind_arrives_at_least_once_through_failed_attempts_and_kill_9(tmp_path: Path) -> None:
    async with WebhookServer() as hook, ProviderServer() as provider:
        # The flaky provider fails once (its breaker opens at one failure), then answers (it closes).
        provider.add(Respond.json(500, {"error": {"message": "overloaded", "type": "server_error"}}))
        provider.add(Respond.stream(openai_text(["done for this round"])))
        slow = TEST_MODELS["providers"]["test"]
        providers = {
            **TEST_MODELS["providers"],
            "gone": slow,
            "flaky": {
                "kind": "openai",
                "base_url": f"{provider.url}/v1",
                "api_key": "sk-test",
                "failure_threshold": 1,
                "breaker_cooldown_seconds": 0.2,
            },
        }
        d = Daemon(tmp_path / "state")
        write_config(d, providers, notify_conf(hook))
        hook.respond = lambda r: 503  # the receiver is down for the whole first life of the daemon
        d.start()
        try:
            completed = await add_goal(d, "finish [rounds=1]", "--model", "test:worker")
            exhausted = await add_goal(d, "one round only", "--model", "flaky:m", "--max-rounds", "1")
            to_cancel = await add_goal(d, "long [rounds=50 delay=0.5]", "--model", "test:worker")
            to_pause = await add_goal(d, "long [rounds=50 delay=0.5]", "--model", "test:worker")
            to_fail = await add_goal(d, "long [rounds=50 delay=0.5]", "--model", "gone:worker")
            await d.acli_json("goal", "cancel", to_cancel)
            await d.acli_json("goal", "pause", to_pause)
            await wait_goal(d.socket_path, completed, {"completed"})
            await wait_goal(d.socket_path, exhausted, {"exhausted"})
            # Both fire while the daemon is down: one is missed (skip); the other fires at the restart
            # and fails, since its model's provider is gone from the config by then.
            # (Far enough ahead for two CLI calls on a loaded machine; the daemon is killed before it.)
            at = datetime.now(UTC) + timedelta(seconds=8)
            when = at.isoformat()
            await d.acli_json("schedule", "add", "--at", when, "--misfire", "skip", "x", "--model", "test:worker")
            await d.acli_json("schedule", "add", "--at", when, "y", "--model", "gone:worker")
            # Every change above has committed (its notification with it); nothing was accepted yet.
            before_kill = committed_ids(d.state_dir)
            assert set(before_kill.values()) >= {
                "goal_completed", "goal_exhausted", "goal_cancelled", "goal_paused", "breaker_opened", "breaker_closed"
            }  # fmt: skip
            assert hook.accepted() == []
            d.kill()  # kill -9 between the changes and their delivery
            # Not a settling sleep: the schedules' instant must pass while the daemon is down.
            await asyncio.sleep(max(0.0, (at - datetime.now(UTC)).total_seconds()) + 0.1)
            # Second life: the 'gone' provider is no longer configured; the receiver fails each id twice.
            write_config(d, {k: v for k, v in providers.items() if k != "gone"}, notify_conf(hook))
            hook.respond = fail_first(2)
            # (fail_first counts from now: the 503s of the first life do not count toward it.)
            d.start()
            await wait_goal(d.socket_path, to_fail, {"failed"})

            def all_delivered() -> bool:
                ids = committed_ids(d.state_dir)
                return set(ids.values()) >= ALL_KINDS and set(ids) <= set(carried(hook))

            try:
                await hook.wait(all_delivered, 60, "every committed notification accepted")
            except TimeoutError:
                ids = committed_ids(d.state_dir)
                missing = {i: k for i, k in ids.items() if i not in carried(hook)}
                raise AssertionError(f"not accepted: {missing}; daemon log:\n{d.stderr()[-3000:]}") from None
            ids = committed_ids(d.state_dir)
            counts = carried(hook)
            assert set(before_kill) <= set(ids)
            # Each id reached the receiver at least once: no kill fell between a delivery and its record,
            # so each was accepted exactly once, whatever failed before.
            assert {i: counts[i] for i in ids} == dict.fromkeys(ids, 1)
            assert {r.json["kind"] for r in hook.accepted()} >= ALL_KINDS
            # Failed attempts came first: every message was refused twice before it was accepted.
            tries = Counter(r.notification_id for r in hook.received if r.status != 503)
            assert all(n == 3 for n in tries.values()), tries
            failed_goal = next(r.json for r in hook.accepted() if r.json["kind"] == "goal_failed")
            assert failed_goal["goal"]["id"] == to_fail and failed_goal["reasonCode"] == "unknown_model"
            missed = next(r.json for r in hook.accepted() if r.json["kind"] == "schedule_missed")
            assert missed["status"] == "missed" and "skip" in missed["reason"]
        finally:
            d.close()


async def test_an_id_arrives_twice_only_when_the_kill_falls_between_delivery_and_record(tmp_path: Path) -> None:
    async with WebhookServer() as hook:
        d = Daemon(tmp_path / "state")
        write_config(d, TEST_MODELS["providers"], notify_conf(hook, group_window_seconds=0))
        hook.respond = lambda r: 503
        d.start()
        try:
            goals = [await add_goal(d, f"long {n} [rounds=50 delay=0.5]", "--model", "test:worker") for n in range(3)]
            for g in goals:
                await d.acli_json("goal", "cancel", g)
            assert d.proc is not None
            pid = d.proc.pid
            killed_at: list[float] = []

            def kill_before_answering(r: Received) -> None:
                # The delivery has happened (the receiver has it whole); the daemon dies before its record.
                if not killed_at:
                    os.kill(pid, signal.SIGKILL)
                    killed_at.append(r.at)

            hook.before_answer = kill_before_answering
            hook.respond = lambda r: 200
            await hook.wait(lambda: bool(killed_at), what="a delivery to kill the daemon on")
            d.proc.wait(30)
            hook.before_answer = None
            first_life = {r.notification_id for r in hook.accepted() if r.at <= killed_at[0]}
            d.start()
            await hook.wait(lambda: set(committed_ids(d.state_dir)) <= set(hook.accepted_ids()), what="all three")
            # A change after the restart is delivered once.
            later = await add_goal(d, "long [rounds=50 delay=0.5]", "--model", "test:worker")
            await d.acli_json("goal", "cancel", later)
            await hook.wait(lambda: len(committed_ids(d.state_dir)) == 4 and len(hook.accepted_ids()) == 4)
            counts = hook.accepted_ids()
            assert first_life, "the kill fell on a delivery"
            twice = {i for i, n in counts.items() if n == 2}
            assert twice == first_life  # exactly the deliveries the kill cut off from their record
            assert all(n == 1 for i, n in counts.items() if i not in first_life)
            assert max(counts.values()) == 2
        finally:
            d.close()


async def test_one_401_that_pauses_many_goals_is_one_message_and_notify_test_works(tmp_path: Path) -> None:
    n = 12
    async with WebhookServer() as hook, ProviderServer() as provider:
        refusal = {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "code": "x"}}
        provider.add(*(Respond.json(401, refusal) for _ in range(n)))
        providers = {"revoked": {"kind": "openai", "base_url": f"{provider.url}/v1", "api_key": "sk-revoked"}}
        d = Daemon(tmp_path / "state")
        write_config(d, providers, notify_conf(hook, group_window_seconds=5))
        d.start()
        try:
            # Created at once (one connection each), so their pauses fall within one grouping window.
            created = await asyncio.gather(
                *(rpc(d.socket_path, "goal/create", {"objective": f"goal {i}", "model": "revoked:m"}) for i in range(n))
            )
            goals = [c["goalId"] for c in created]
            for g in goals:
                paused = await wait_goal(d.socket_path, g, {"paused"})
                assert paused["statusReason"].startswith("auth_error"), paused
            await hook.wait(lambda: carried(hook).total() == n, what=f"{n} paused goals")
            messages = hook.accepted()
            assert len(messages) == 1, [m.json["summary"] for m in messages]
            body = messages[0].json
            assert body["kind"] == "goal_paused" and body["count"] == n
            assert body["cause"] == "goal_paused:auth_error:revoked"
            assert body["summary"].startswith(f"{n} goals paused (authentication failed, provider revoked)")
            assert {g["id"] for g in body["goals"]} == set(goals)

            code, out, err = await d.acli("notify", "test")
            assert code == 0, err
            assert out.startswith("ops: delivered (200")
            assert hook.received[-1].json["kind"] == "test"
            code, out, err = await d.acli("notify", "test", "pager")
            assert code == 3 and "no notification sink 'pager': the configured sinks are ops" in err
            assert (await rpc(d.socket_path, "notify/test", {"sink": "ops"}))["results"][0]["ok"] is True
        finally:
            d.close()


async def test_a_goals_notification_names_it_by_key_with_the_clis_words(tmp_path: Path) -> None:
    async with WebhookServer() as hook:
        d = Daemon(tmp_path / "state")
        write_config(d, TEST_MODELS["providers"], notify_conf(hook, group_window_seconds=0))
        d.start()
        try:
            made = await d.acli_json(
                "goal", "add", "Notes [rounds=50 delay=0.2]", "--model", "test:worker", "--key", "nightly",
                "--title", "The nightly notes",
            )  # fmt: skip
            await asyncio.to_thread(d.calls.wait, "worker round=1")
            code, out, err = await d.acli("goal", "pause", "nightly", "--reason", "provider maintenance")
            assert code == 0, err
            await hook.wait(lambda: len(hook.accepted()) == 1, what="the pause's notification")
            body = hook.accepted()[0].json
            assert body["kind"] == "goal_paused" and body["goal"]["id"] == made["goalId"], body
            code, listed, err = await d.acli("goal", "list")
            words = "paused (by operator: provider maintenance)"
            assert words in out and "by operator: provider maintenance" in listed, (out, listed)  # the CLI's words
            assert body["summary"].startswith(f"goal 'nightly' {words} after "), body["summary"]
            assert body["reasonText"] == "by operator: provider maintenance", body
            assert body["reason"] == "by_operator: provider maintenance" and body["reasonCode"] is None, body

            code, _out, err = await d.acli("goal", "cancel", "nightly")
            assert code == 0, err
            await hook.wait(lambda: len(hook.accepted()) == 2, what="the cancel's notification")
            cancelled = hook.accepted()[1].json
            assert cancelled["summary"].startswith("goal 'nightly' cancelled (by request) after "), cancelled
        finally:
            d.close()


def test_a_bad_notify_section_stops_the_daemon_with_the_key(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "state")
    try:
        d.config_path.write_text(
            f'state_dir = "{d.state_dir}"\n[[notify.sinks]]\ntype = "webhook"\nname = "ops"\nurl = "ops.example"\n'
        )
        done = d.cli("serve", timeout=30)
        assert done.returncode == 78
        assert "notify.sinks.0.webhook.url" in done.stderr and "http:// or https:// URL" in done.stderr
        assert not (d.state_dir / "goald.db").exists()
    finally:
        d.close()
