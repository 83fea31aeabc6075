"""The status page in a real headless Chromium against a real daemon process.

Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them), driven by selenium with
the driver's path given explicitly; as root Chromium needs ``--no-sandbox``. Every wait is a
``WebDriverWait`` on something the page shows, under a time limit. Kept to two tests: a browser is
heavy on a shared machine.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import TEST_MODELS, Daemon, all_events, paused_at_rest, wait_goal

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')")
if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
    pytest.skip(
        f"needs Debian's chromium and chromium-driver ({CHROMIUM}, {CHROMEDRIVER}):"
        " apt-get install chromium chromium-driver",
        allow_module_level=True,
    )

from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def waiter(driver: Any, seconds: float) -> Any:
    """A wait that reads again when the live page replaced an element between finding and reading it."""
    return WebDriverWait(driver, seconds, ignored_exceptions=[StaleElementReferenceException])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1100"):
        opts.add_argument(arg)
    opts.add_argument(f"--user-data-dir={tmp_path / 'chromium'}")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def start(tmp_path: Path, port: int) -> tuple[Daemon, str]:
    config = {**TEST_MODELS, "default_model": "test:worker", "web": {"enabled": True, "listen": f"127.0.0.1:{port}"}}
    d = Daemon(tmp_path / "state", config=config)
    token = d.cli("web", "token", "add", "alice").stdout.strip()
    d.start()
    return d, token


def add_goal(d: Daemon, objective: str, *args: str) -> str:
    done = d.cli("goal", "add", objective, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[0]


def status_of(d: Daemon, gid: str) -> str:
    return str(d.cli_json("goal", "show", gid)["status"])


def row_cell(driver: Any, gid: str, selector: str) -> str:
    """One cell of a goal's row, found and read in one script: the live table replaces whole rows."""
    text = driver.execute_script(
        'const r = document.querySelector(`tr[data-goal="${arguments[0]}"]`);'
        " const c = r && r.querySelector(arguments[1]); return c ? c.innerText.trim() : null",
        gid,
        selector,
    )
    assert text is not None, f"no {selector} cell in the row of goal {gid}"
    return str(text)


def row_status(driver: Any, gid: str) -> str:
    return row_cell(driver, gid, ".status")


def row_order(driver: Any) -> list[str]:
    return [
        str(g)
        for g in driver.execute_script(
            "return Array.from(document.querySelectorAll('table#goals tbody tr')).map(r => r.dataset.goal)"
        )
    ]


def seqs(driver: Any) -> list[int]:
    return [
        int(x)
        for x in driver.execute_script(
            "return Array.from(document.querySelectorAll('#timeline li.ev')).map(e => e.dataset.seq)"
        )
    ]


def bands_of(driver: Any) -> list[dict[str, Any]]:
    """Each band of the timeline as the page shows it: its attributes, summary (``textContent``: a
    collapsed band's too), conversation link and entries (sequence number and text)."""
    return list(
        driver.execute_script(
            "return Array.from(document.querySelectorAll('#timeline details.band')).map(b => ({"
            " first: b.dataset.first, last: b.dataset.last, open: b.dataset.open,"
            " summary: b.querySelector('summary').textContent,"
            " conv: (b.querySelector('a.conv') || {getAttribute: () => null}).getAttribute('href'),"
            " entries: Array.from(b.querySelectorAll('li.ev')).map(e => [e.dataset.seq, e.textContent,"
            " e.className])}))"
        )
    )


def test_goals_table_goal_page_live_pause_and_events(tmp_path: Path, browser: Any) -> None:
    port = free_port()
    d, token = start(tmp_path, port)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    try:
        done = add_goal(d, "Finish quickly [rounds=1 delay=0.01]", "--title", "quick one")
        exhausted = add_goal(
            d, "Needs more rounds [rounds=9 delay=0.01]", "--max-rounds", "1", "--title", "short budget"
        )
        paused = add_goal(d, "Pause me [rounds=300 delay=0.05]", "--max-tokens", "5000000", "--title", "to pause")
        running = add_goal(d, "Keep going [rounds=300 delay=0.4]", "--max-tokens", "9000000", "--title", "runner")
        cancelled = add_goal(d, "Cancel me [rounds=300 delay=0.4]", "--title", "to cancel")
        # Claims every round, each refused by its verification (paused unverified at the third); its
        # first round's write aims outside the work directory (a failed tool call).
        refused = add_goal(
            d, "Claim at once [rounds=1 delay=0.01 fail_round=1]", "--verify", "test -f never.txt", "--title", "refused"
        )
        asyncio.run(wait_goal(d.socket_path, done, {"completed"}))
        asyncio.run(wait_goal(d.socket_path, exhausted, {"exhausted"}))
        d.calls.wait("worker round=3", 60)  # the goal to pause has done some rounds (a chart to draw)
        assert d.cli("goal", "pause", paused).returncode == 0
        assert d.cli("goal", "cancel", cancelled).returncode == 0
        asyncio.run(wait_goal(d.socket_path, paused, {"paused"}))
        asyncio.run(wait_goal(d.socket_path, refused, {"paused"}))
        wait = waiter(browser, 30)

        # The goals table: each goal with its status and reason, as `goald` words them.
        browser.get(f"http://127.0.0.1:{port}/?token={token}")
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "table#goals tbody tr"))
        assert row_status(browser, done) == "completed (unverified: no verification)"
        assert row_status(browser, exhausted) == "exhausted (round limit reached)"
        assert row_status(browser, paused) == "paused (by request)"
        assert row_status(browser, running) == "active"
        assert row_status(browser, cancelled) == "cancelled (by request)"
        order = row_order(browser)
        assert order.index(paused) < order.index(running) < order.index(done)  # attention first
        browser.save_screenshot(str(shots / "goals.png"))
        # A relative time advances in a row that does not move (the completed goal's "age"): the same
        # row element, its text moved on by the page's ticker.
        browser.execute_script('document.querySelector(`tr[data-goal="${arguments[0]}"]`).dataset.marked = "1"', done)
        aged = row_cell(browser, done, "td:nth-child(6)")
        assert aged.endswith(" ago") or aged == "now", aged
        wait.until(lambda b: row_cell(b, done, "td:nth-child(6)") != aged)
        assert browser.execute_script(
            'return document.querySelector(`tr[data-goal="${arguments[0]}"]`).dataset.marked === "1"', done
        ), "the row was replaced: the time moved with it, not by itself"
        # The table is live too: the running goal's row is re-rendered as its rounds go by, no reload.
        browser.execute_script("window.__table_page = true")
        wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-live") == "1")

        def rounds_cell(b: Any) -> str:
            return row_cell(b, running, "td:nth-child(5)")

        before = rounds_cell(browser)
        wait.until(lambda b: rounds_cell(b) != before)
        assert browser.execute_script("return window.__table_page === true")
        browser.get(f"http://127.0.0.1:{port}/?status=paused")
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "table#goals tbody tr"))
        assert sorted(row_order(browser)) == sorted([paused, refused])

        # A paused goal: its burn-down chart (drawn) and its timeline of rounds.
        browser.get(f"http://127.0.0.1:{port}/goals/{paused}")
        wait.until(
            lambda b: b.execute_script(
                "const i = document.getElementById('burn'); return i.complete && i.naturalWidth > 0"
            )
        )
        bands = browser.find_elements(By.CSS_SELECTOR, "#timeline details.band")
        assert any(b.find_element(By.TAG_NAME, "summary").text.startswith("round ") for b in bands)
        assert seqs(browser) and len(seqs(browser)) == len(set(seqs(browser)))
        assert browser.find_element(By.ID, "goal-status").text == "paused (by request)"
        # A band expands to its conversation, loaded on demand.
        first = bands[-1]
        first.find_element(By.TAG_NAME, "summary").click()
        first.find_element(By.CSS_SELECTOR, "a.conv").click()
        wait.until(lambda b: first.find_elements(By.CSS_SELECTOR, ".conversation .msg"))
        browser.save_screenshot(str(shots / "goal-paused.png"))

        # The paused goal (a budget): a burn-down; it offers "send" with "and resume".
        assert browser.find_elements(By.ID, "send-resume")
        assert browser.find_element(By.CSS_SELECTOR, "#goal h2").text == "Burn-down"

        # A completed goal at rest: its top band is not running, it takes no message (no "send ...
        # and resume"), and without a budget its chart reads as usage, not as a budget running out.
        browser.get(f"http://127.0.0.1:{port}/goals/{done}")
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#timeline details.band"))
        top = bands_of(browser)[0]
        assert top["open"] == "0" and not top["summary"].endswith("running"), top
        assert "→ completed" in top["summary"] and top["summary"].startswith("round 1"), top
        assert not browser.find_elements(By.ID, "send-form") and not browser.find_elements(By.ID, "send-resume")
        assert "takes no message" in browser.find_element(By.ID, "send-none").text
        assert browser.find_element(By.CSS_SELECTOR, "#goal h2").text == "Usage (no budget)"
        browser.get(f"http://127.0.0.1:{port}/goals/{done}/burn.svg")
        svg = browser.page_source
        assert 'data-mode="usage"' in svg and "used so far (no budget)" in svg and "%" not in svg

        # A refused verification is on the band of the round whose claim it refused, and a failed
        # tool call is marked, in its entry and in its band's counts.
        browser.get(f"http://127.0.0.1:{port}/goals/{refused}")
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#timeline details.band"))
        bands = bands_of(browser)
        rounds = [b for b in bands if b["summary"].startswith("round ")]
        assert len(rounds) == 3, bands
        for band in rounds:
            kinds = [cls.split()[1] for _seq, _text, cls in band["entries"]]
            assert kinds.count("goal-claim") == 1 and kinds.count("goal-verified") == 1, band
            assert kinds.index("goal-claim") < kinds.index("goal-verified"), band
            assert "verification refused" in band["summary"], band
        assert bands[0]["open"] == "0" and "→ paused" in bands[0]["summary"], bands[0]  # at rest
        first_round = rounds[-1]
        assert first_round["summary"].startswith("round 1 ") and "1 failed" in first_round["summary"], first_round
        failed = [text for _seq, text, cls in first_round["entries"] if "failed" in cls.split()]
        assert len(failed) == 1 and "failed · tool write_file" in failed[0], first_round
        assert all("failed" not in cls.split() for b in rounds[:-1] for _s, _t, cls in b["entries"])
        assert all("failed" not in b["summary"] for b in rounds[:-1])

        # A running goal: new events appear without a reload; pause changes the status in place.
        browser.get(f"http://127.0.0.1:{port}/goals/{running}")
        wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-live") == "1")
        browser.execute_script("window.__same_page = true")
        shown = int(browser.find_element(By.ID, "goal").get_attribute("data-last-seq"))
        wait.until(lambda b: max(seqs(b)) > shown)
        assert browser.find_elements(By.ID, "send-form") and not browser.find_elements(By.ID, "send-resume")
        browser.find_element(By.ID, "btn-pause").click()
        waiter(browser, 60).until(lambda b: b.find_element(By.ID, "goal-status").text == "paused (by request)")
        assert browser.execute_script("return window.__same_page === true")  # no reload happened
        assert status_of(d, running) == "paused"
        show = d.cli("goal", "show", running)
        assert "paused (by request)" in show.stdout
        session = d.cli_json("goal", "show", running)["sessionId"]
        changed = [e for e in asyncio.run(all_events(d.socket_path, session)) if e["type"] == "goal/changed"]
        assert changed[-1]["data"]["status"] == "paused" and changed[-1]["data"].get("web") == "alice"
        wait.until(lambda b: any("by web:alice" in e.text for e in b.find_elements(By.CSS_SELECTOR, "li.goal-changed")))
        browser.save_screenshot(str(shots / "goal-live.png"))

        # Schedules and the daemon.
        assert (
            d.cli(
                "schedule",
                "add",
                "--cron",
                "0 3 * * *",
                "--timezone",
                "Europe/Berlin",
                "--key",
                "nightly",
                "Refresh [rounds=1 delay=0.01]",
            ).returncode
            == 0
        )
        browser.get(f"http://127.0.0.1:{port}/schedules")
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "tr[data-schedule]"))
        assert "Europe/Berlin" in browser.find_element(By.CSS_SELECTOR, "table.schedules").text
        browser.save_screenshot(str(shots / "schedules.png"))
        browser.get(f"http://127.0.0.1:{port}/daemon")
        wait.until(lambda b: b.find_elements(By.ID, "loop-lag"))
        main = browser.find_element(By.TAG_NAME, "main").text
        assert "serving" in main
        # Plain words, never raw JSON (no null, no {"ok": true}).
        assert "null" not in main and "{" not in main and '"' not in main and "true" not in main, main
        browser.save_screenshot(str(shots / "daemon.png"))
        assert sorted(p.name for p in shots.iterdir()) == [
            "daemon.png",
            "goal-live.png",
            "goal-paused.png",
            "goals.png",
            "schedules.png",
        ]
    finally:
        d.close()


def test_a_page_open_across_a_restart_resumes_from_the_right_sequence_number(tmp_path: Path, browser: Any) -> None:
    port = free_port()
    d, token = start(tmp_path, port)
    try:
        gid = add_goal(d, "Long work [rounds=300 delay=0.15]", "--max-tokens", "9000000")
        d.calls.wait("worker round=2", 60)
        wait = waiter(browser, 60)
        browser.get(f"http://127.0.0.1:{port}/goals/{gid}?token={token}")
        wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-live") == "1")
        browser.execute_script("window.__same_page = true")
        before = max(seqs(browser))
        at_load = max(int(b["first"]) for b in bands_of(browser))
        wait.until(lambda b: max(seqs(b)) > before)  # live before the restart

        assert d.terminate() == 0
        wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-live") == "0")
        at_stop = max(seqs(browser))
        d.start()
        wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-live") == "1")
        d.calls.wait("worker", 60)  # the goal runs again after the restart
        assert d.cli("goal", "pause", gid).returncode == 0
        asyncio.run(wait_goal(d.socket_path, gid, {"paused"}))
        session = d.cli_json("goal", "show", gid)["sessionId"]
        # Let the paused goal come to rest (its last round ended and counted): then nothing more is written.
        asyncio.run(paused_at_rest(d.socket_path, gid, session, limit=60))
        last = max(e["seq"] for e in asyncio.run(all_events(d.socket_path, session)))
        wait.until(lambda b: max(seqs(b)) == last)
        shown = seqs(browser)
        assert len(shown) == len(set(shown)), "a timeline entry was shown twice"
        assert sorted(shown) == list(range(min(shown), last + 1)), "a timeline entry is missing"
        assert max(s for s in shown if s <= at_stop) == at_stop and last > at_stop  # resumed past the restart
        assert browser.execute_script("return window.__same_page === true")
        # Every band as the live page built it reads as it does after a reload (counts, conversation
        # link, entries), bands added live included; the goal at rest has no band "running".
        live = {b["first"]: b for b in bands_of(browser)}
        assert int(max(live, key=int)) > at_load, "no band was added live"
        assert not any(b["summary"].endswith("running") or b["open"] == "1" for b in live.values())
        browser.refresh()
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#timeline details.band"))
        reloaded = bands_of(browser)
        assert len(reloaded) >= 3
        for band in reloaded:
            assert live[band["first"]] == band, (live[band["first"]], band)
        browser.save_screenshot(str(tmp_path / "after-restart.png"))
    finally:
        d.close()


def test_a_waiting_goal_is_answered_from_its_page_and_the_questions_view(tmp_path: Path, browser: Any) -> None:
    """A goal that asked shows its question with a button per option and a text field; the
    questions view lists every open question; a click answers (as the page's token) and the goal
    goes on; a second goal is withdrawn from the questions view with a reason."""
    port = free_port()
    d, token = start(tmp_path, port)
    try:
        first = add_goal(d, "Write the report.", "--model", "test:asker", "--key", "first")
        second = add_goal(d, "Write another report.", "--model", "test:asker", "--key", "second")
        asyncio.run(wait_goal(d.socket_path, first, {"waiting"}))
        asyncio.run(wait_goal(d.socket_path, second, {"waiting"}))
        wait = waiter(browser, 30)
        browser.get(f"http://127.0.0.1:{port}/questions?token={token}")
        wait.until(lambda b: b.find_elements(By.ID, "open-count"))
        assert browser.find_element(By.ID, "open-count").text == "2 open"
        assert len(browser.find_elements(By.CSS_SELECTOR, "div.question")) == 2

        browser.get(f"http://127.0.0.1:{port}/goals/{first}")
        wait.until(lambda b: b.find_elements(By.ID, "question-text"))
        assert browser.find_element(By.ID, "question-text").text == "Which database should the report read?"
        assert browser.find_element(By.ID, "goal-status").text.startswith("waiting (question: Which database")
        assert [b.text for b in browser.find_elements(By.CSS_SELECTOR, "button.opt")] == ["sqlite", "postgres"]
        browser.find_element(By.ID, "opt-2").click()
        try:
            wait.until(lambda b: "done=answered" in b.current_url)
        except Exception:
            raise AssertionError(browser.current_url + browser.find_element(By.TAG_NAME, "body").text[:800]) from None
        assert d.calls.wait("asker heard=", 60) == "asker heard=postgres"
        done = asyncio.run(wait_goal(d.socket_path, first, {"completed"}))
        assert done["rounds"] == 2
        [q] = d.cli_json("goal", "questions", first)["questions"]
        assert (q["answer"], q["answeredBy"]) == ("postgres", "web token alice")

        browser.get(f"http://127.0.0.1:{port}/questions")
        wait.until(lambda b: b.find_element(By.ID, "open-count").text == "1 open")
        browser.find_element(By.ID, "withdraw-reason").send_keys("use the one in the config")
        browser.find_element(By.ID, "btn-withdraw").click()
        wait.until(lambda b: "done=withdrawn" in b.current_url)
        asyncio.run(wait_goal(d.socket_path, second, {"completed"}))
        [w] = d.cli_json("goal", "questions", second)["questions"]
        assert (w["how"], w["answer"], w["answeredBy"]) == ("withdrawn", "use the one in the config", "web token alice")
    finally:
        d.close()
