"""Notifications in process: the outbox on a real SQLite file, the real sender, a local webhook server.

Each test writes notifications through :func:`agent.outbox.put` inside real transactions (as goals,
schedules and breakers do), runs the real :class:`~daemon.alerts.sender.Sender` against sinks that
POST to the test's own server on 127.0.0.1, and waits on what the server receives. The end-to-end
tests (tests/e2e/test_notify_daemon.py) do the same through a real daemon with real ``kill -9``.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from webhook_server import WebhookServer, fail_first

from agent.backends import NAMED_LOCKS, WRITER_LOCK
from agent.models.health import CircuitBreaker
from agent.outbox import attempts, backlog, put
from agent.store import Store
from agent.tx import Tx
from daemon.alerts import Alerts, NotifySettings, UnknownSink
from daemon.alerts.kinds import breaker_notice
from daemon.alerts.payload import verify
from daemon.alerts.sender import Sender
from daemon.alerts.sinks import HttpClient, build_sinks
from daemon.settings import ConfigError, Settings, load_settings, sandbox_profile


@contextlib.asynccontextmanager
async def sending(store: Store, conf: NotifySettings, tmp_path: Path | None = None) -> AsyncIterator[Sender]:
    """The real sender over ``store`` and ``conf``'s sinks, running until the block ends."""
    http = HttpClient()
    profile = sandbox_profile(Settings(state_dir=tmp_path or Path("/nonexistent-goald")))
    sinks = build_sinks(conf, http, lambda wd, pol: profile.sandbox(wd, policy=pol))
    sender = Sender(store, conf, sinks)
    task = asyncio.create_task(sender.run())
    try:
        yield sender
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await http.aclose()


async def until_recorded(sender: Sender, store: Store, predicate: Callable[[dict[str, int]], bool]) -> dict[str, int]:
    """Wait (at most 30 s) until the outbox's backlog satisfies ``predicate``; woken by each recorded attempt."""
    async with asyncio.timeout(30):
        while True:
            sender.recorded.clear()
            counts = await store.read(backlog)
            if predicate(counts):
                return counts
            await sender.recorded.wait()


def webhook(hook: WebhookServer, name: str = "hook", **kw: Any) -> dict[str, Any]:
    return {"type": "webhook", "name": name, "url": f"{hook.url}/{name}", **kw}


def settings(*sinks: dict[str, Any], **kw: Any) -> NotifySettings:
    return NotifySettings.model_validate(
        {"sinks": list(sinks), "retry_first_seconds": 0.02, "retry_max_seconds": 0.1, **kw}
    )


def goal_payload(n: int, reason: str = "auth_error") -> dict[str, Any]:
    return {
        "goal": {"id": f"goal_{n}", "key": None, "title": f"goal number {n}"},
        "status": "paused",
        "reason": reason,
        "reasonCode": reason,
        "provider": "openai",
        "counters": {"rounds": 1, "tokens": 10, "cost": 0.0},
        "summary": f"goal 'goal number {n}' paused: {reason}",
    }


async def test_a_change_that_does_not_commit_notifies_nobody(store: Store) -> None:
    async with WebhookServer() as hook, sending(store, settings(webhook(hook))) as sender:

        def rolled_back(tx: Tx) -> str:
            nid = put(tx, "goal_paused", goal_payload(1))
            raise RuntimeError(f"the change fails after writing {nid}")

        with pytest.raises(RuntimeError, match="the change fails") as failed:
            await store.transact(rolled_back)
        lost = str(failed.value).rsplit(" ", 1)[-1]
        marker = await store.transact(lambda tx: put(tx, "goal_completed", goal_payload(2, "verified")))
        await hook.wait(lambda: marker in hook.accepted_ids(), what="the committed notification")
        # Sealed and delivered in id order: the committed one came, the rolled-back one never existed.
        assert lost not in {r.notification_id for r in hook.received}
        assert set(hook.accepted_ids()) == {marker}
        counts = await until_recorded(sender, store, lambda c: c["delivered"] == 1)
        assert counts == {"unsealed": 0, "pending": 0, "delivered": 1, "failed": 0}


async def test_failed_attempts_are_retried_with_backoff_and_every_attempt_is_recorded(store: Store) -> None:
    async with WebhookServer() as hook, sending(store, settings(webhook(hook))) as sender:
        hook.respond = fail_first(3, status=503)
        nid = await store.transact(lambda tx: put(tx, "goal_failed", goal_payload(1, "workdir_missing")))
        await until_recorded(sender, store, lambda c: c["delivered"] == 1)
        records = await store.read(lambda conn: attempts(conn, nid))
    assert [(a["attempt"], a["ok"], a["status"]) for a in records] == [
        (1, False, 503),
        (2, False, 503),
        (3, False, 503),
        (4, True, 200),
    ]
    assert all("HTTP 503" in a["error"] for a in records[:3])
    # Every attempt carried the same id, in the headers and in the payload.
    assert {r.notification_id for r in hook.received} == {nid}
    assert {r.headers["idempotency-key"] for r in hook.received} == {nid}
    assert {r.json["id"] for r in hook.received} == {nid}


async def test_a_delivery_gives_up_after_max_attempts(store: Store) -> None:
    async with WebhookServer() as hook, sending(store, settings(webhook(hook), max_attempts=2)) as sender:
        hook.respond = lambda r: 500
        nid = await store.transact(lambda tx: put(tx, "goal_failed", goal_payload(1)))
        await hook.wait(lambda: len(hook.received) == 2, what="two attempts")
        marker = await store.transact(lambda tx: put(tx, "goal_completed", goal_payload(2)))
        hook.respond = lambda r: 200
        await hook.wait(lambda: marker in hook.accepted_ids(), what="the marker")
        assert [r.notification_id for r in hook.received].count(nid) == 2
        assert (await until_recorded(sender, store, lambda c: c["delivered"] == 1))["failed"] == 1


async def test_notifications_of_one_cause_are_one_message_with_the_count(store: Store) -> None:
    async with WebhookServer() as hook:
        conf = settings(webhook(hook), group_window_seconds=0.3)

        def pause_many(tx: Tx) -> list[str]:
            # One 401 pauses 200 goals (each in its own transaction in life; one here, same rows).
            return [put(tx, "goal_paused", goal_payload(n), group="goal_paused:auth_error:openai") for n in range(200)]

        ids = await store.transact(pause_many)
        alone = await store.transact(lambda tx: put(tx, "goal_completed", goal_payload(999, "verified")))
        async with sending(store, conf):
            await hook.wait(lambda: len(hook.accepted()) == 2, what="two messages")
    by_id = {r.notification_id: r.json for r in hook.accepted()}
    grouped = by_id[ids[0]]
    assert grouped["count"] == 200
    assert grouped["ids"] == ids
    assert grouped["cause"] == "goal_paused:auth_error:openai"
    assert grouped["summary"].startswith("200 goals paused (authentication failed, provider openai)")
    assert len(grouped["goals"]) == 20 and grouped["goals"][0]["id"] == "goal_0"
    assert by_id[alone]["count"] == 1 and by_id[alone]["ids"] == [alone]


async def test_the_hmac_signature_verifies_and_the_key_is_not_logged(
    store: Store, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TEST_HOOK_KEY", "s3cret-signing-key")
    async with WebhookServer() as hook:
        hook.respond = fail_first(1)
        async with sending(store, settings(webhook(hook, secret={"env": "TEST_HOOK_KEY"}))):
            nid = await store.transact(lambda tx: put(tx, "goal_paused", goal_payload(1, "stalled")))
            await hook.wait(lambda: nid in hook.accepted_ids())
    for r in hook.received:
        assert verify("s3cret-signing-key", r.body, r.headers["x-goald-signature"])
        assert not verify("another key", r.body, r.headers["x-goald-signature"])
    body = hook.accepted()[0].json
    assert body["goal"] == {"id": "goal_1", "key": None, "title": "goal number 1"}
    assert body["status"] == "paused" and body["reason"] == "stalled"
    assert body["counters"] == {"rounds": 1, "tokens": 10, "cost": 0.0}
    assert body["summary"] and body["time"] and body["kind"] == "goal_paused"
    out, err = capfd.readouterr()
    assert "s3cret-signing-key" not in out + err


async def test_each_sink_receives_only_the_kinds_it_asks_for(store: Store) -> None:
    async with WebhookServer() as hook:
        conf = settings(webhook(hook, "all"), webhook(hook, "failures", kinds=["goal_failed", "schedule_error"]))
        async with sending(store, conf):
            paused = await store.transact(lambda tx: put(tx, "goal_paused", goal_payload(1)))
            failed = await store.transact(lambda tx: put(tx, "goal_failed", goal_payload(2)))
            await hook.wait(lambda: len(hook.accepted()) == 3, what="three deliveries")
        assert set(hook.accepted_ids("/all")) == {paused, failed}
        assert set(hook.accepted_ids("/failures")) == {failed}

        def sinks_of(conn: sqlite3.Connection) -> set[tuple[str, str]]:
            rows = conn.execute("SELECT message_id, sink FROM outbox_deliveries").fetchall()
            return {(r[0], r[1]) for r in rows}

        # The filtered-out delivery was never created, so it can never arrive.
        assert await store.read(sinks_of) == {(paused, "all"), (failed, "all"), (failed, "failures")}


async def test_a_template_makes_a_chat_style_payload_and_ntfy_gets_plain_text(store: Store) -> None:
    async with WebhookServer() as hook:
        conf = settings(
            webhook(hook, "chat", template='{"text": "[$kind] $summary", "id": "$id"}'),
            {"type": "ntfy", "name": "phone", "url": f"{hook.url}/phone", "priority": {"goal_failed": "urgent"}},
        )
        async with sending(store, conf):
            p = goal_payload(1, 'blocked: the "vendor" API says no')
            p["goal"]["title"] = 'fix "the" build'
            nid = await store.transact(lambda tx: put(tx, "goal_failed", p))
            await hook.wait(lambda: len(hook.accepted()) == 2, what="both sinks")
    chat = hook.accepted("/chat")[0]
    assert chat.json == {"text": f"[goal_failed] {p['summary']}", "id": nid}
    phone = hook.accepted("/phone")[0]
    assert phone.body.decode() == p["summary"]
    assert phone.headers["title"] == 'goald: goal failed - fix "the" build'
    assert phone.headers["priority"] == "urgent"
    assert phone.notification_id == nid


@pytest.mark.needs_bwrap
async def test_a_command_sink_runs_in_the_sandbox_with_the_payload(store: Store, tmp_path: Path) -> None:
    check = (
        "import json, os; p = json.load(open('payload.json'));"
        " assert p['id'] == os.environ['GOALD_NOTIFICATION_ID'] == json.loads(os.environ['GOALD_NOTIFICATION'])['id'];"
        " assert not os.path.exists(os.environ.get('STATE', '/x/none'))"
    )
    conf = settings(
        {"type": "command", "name": "script", "command": ["python3", "-c", check]},
        {"type": "command", "name": "broken", "command": ["sh", "-c", "echo pager unreachable; exit 3"]},
        max_attempts=1,
    )
    async with sending(store, conf, tmp_path) as sender:
        nid = await store.transact(lambda tx: put(tx, "goal_exhausted", goal_payload(1, "round_limit")))
        async with asyncio.timeout(60):
            while True:
                sender.recorded.clear()
                records = await store.read(lambda conn: attempts(conn, nid))
                if len(records) == 2:
                    break
                await sender.recorded.wait()
    by_sink = {a["sink"]: a for a in records}
    assert by_sink["script"]["ok"] is True, by_sink["script"]
    assert by_sink["broken"]["ok"] is False and by_sink["broken"]["status"] == 3
    assert "pager unreachable" in by_sink["broken"]["error"]


async def test_notify_test_reaches_each_sink_and_names_an_unknown_one(store: Store) -> None:
    async with WebhookServer() as hook:
        hook.respond = lambda r: 200 if r.path == "/good" else 404
        alerts = Alerts(settings(webhook(hook, "good"), webhook(hook, "bad")), lambda: sandbox_profile(Settings()))
        try:
            answer = await alerts.test()
            assert [(r["sink"], r["ok"], r["status"]) for r in answer["results"]] == [
                ("good", True, 200),
                ("bad", False, 404),
            ]
            assert hook.received[0].json["kind"] == "test" and hook.received[0].notification_id == answer["id"]
            one = await alerts.test("good")
            assert [r["sink"] for r in one["results"]] == ["good"]
            with pytest.raises(UnknownSink, match="no notification sink 'nope': the configured sinks are good, bad"):
                await alerts.test("nope")
        finally:
            await alerts.http.aclose()


def test_a_breaker_hook_sees_opening_and_closing_once_each() -> None:
    breaker = CircuitBreaker(failure_threshold=2, cooldown=0.0)
    changes: list[tuple[str, str]] = []
    breaker.on_change = lambda before, after: changes.append((before.value, after.value))
    breaker.failure()
    breaker.failure()
    breaker.success()
    assert changes == [("closed", "open"), ("open", "closed")]
    kind, payload = breaker_notice("openai", True, {"failures": 2, "lastError": "HTTP 503"})
    assert kind == "breaker_opened" and payload["summary"].startswith("provider 'openai' circuit breaker open")


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[[notify.sinks]]\ntype = "webhook"\nname = "a"\nurl = "ftp://x"\n', "http:// or https:// URL"),
        ('[[notify.sinks]]\ntype = "webhook"\nname = "a"\n', "give exactly one of url or url_secret"),
        (
            '[[notify.sinks]]\ntype = "webhook"\nname = "a"\nurl = "http://h/"\nkinds = ["goal_exploded"]\n',
            "key 'notify.sinks.0.webhook.kinds.0'",
        ),
        (
            '[[notify.sinks]]\ntype = "webhook"\nname = "a"\nurl = "http://h/"\ntemplate = \'{"t": "$nope"}\'\n',
            "unknown placeholder(s) ['nope']",
        ),
        (
            '[[notify.sinks]]\ntype = "webhook"\nname = "a"\nurl = "http://h/"\ntemplate = \'{"t": $summary}\'\n',
            "is not JSON once its placeholders are filled in",
        ),
        (
            '[[notify.sinks]]\ntype = "ntfy"\nname = "a"\nurl = "http://h/"\n'
            '[[notify.sinks]]\ntype = "webhook"\nname = "a"\nurl = "http://h/"\n',
            "sink names must be unique: a given more than once",
        ),
        ('[[notify.sinks]]\ntype = "pager"\nname = "a"\n', "notify.sinks.0"),
        ('[[notify.sinks]]\ntype = "command"\nname = "a"\ncommand = []\n', "command"),
        ("[notify]\nretry_first_seconds = 10\nretry_max_seconds = 1\n", "retry_max_seconds must be at least"),
    ],
)
def test_bad_notify_config_is_refused_naming_the_key(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "goald.toml"
    path.write_text(f'state_dir = "{tmp_path}"\n{toml}')
    with pytest.raises(ConfigError) as refused:
        load_settings(path)
    assert message in str(refused.value)
    assert "notify" in str(refused.value)


async def test_a_step_with_nothing_to_seal_takes_no_writer_lock(pg_dsn: str) -> None:
    """On PostgreSQL sealing takes the outbox's lock, the writer lock shared (it once took the writer
    lock alone, holding every node's writes for its round trips): a sender's step (each node's, every
    couple of seconds) that finds nothing unsealed reads, and opens no write; one that finds a
    notification seals it (tests/daemon/test_outbox_lock.py: beside the sessions' writes)."""
    store = await Store.open(pg_dsn)
    try:
        sender = Sender(store, settings(), {})
        statements: list[str] = []
        await store.trace(statements.append)
        try:
            await sender.step()  # the first prunes what is old (then once per PRUNE_EVERY)
            statements.clear()
            assert await sender.step() is None
            assert not [s for s in statements if "pg_advisory_xact_lock" in s], statements
            nid = await store.transact(lambda tx: put(tx, "goal_completed", goal_payload(1, "verified")))
            statements.clear()
            await sender.step()
            [lock] = [s for s in statements if "pg_advisory_xact_lock" in s]
            assert f"pg_advisory_xact_lock_shared({WRITER_LOCK}), pg_advisory_xact_lock({NAMED_LOCKS}, " in lock
        finally:
            await store.trace(None)
        assert (await store.read(backlog))["unsealed"] == 0
        sealed = await store.read(
            lambda conn: conn.execute("SELECT message_id FROM outbox WHERE id = ?", (nid,)).fetchone()
        )
        assert sealed is not None and sealed[0] == nid
    finally:
        await store.close()
