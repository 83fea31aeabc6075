"""Declared goals and schedules (the goals file): checked before anything is written, reloaded by key.

In-process: the shipped ``config/goals.example.toml`` passes the daemon's own loader, and each kind
of invalid file is refused with one line naming the file, the entry (by key) and the field. With
the real daemon as a subprocess (``harness.py``): an invalid goals file refuses to start (exit 78)
without touching the store; on SIGHUP an invalid file is logged, changes nothing and the daemon
keeps serving; a valid edit updates the entries by key and adds the new ones. A reload is waited
for the way systemd waits for it: ``RELOADING=1``, then ``READY=1`` on the notify socket.
"""

from __future__ import annotations

import hashlib
import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import TEST_MODELS, Daemon

from daemon.declared import GoalsFileError, check_declared
from daemon.host import Host
from daemon.settings import ConfigError, load_settings

CONFIG = Path(__file__).resolve().parents[2] / "config"
LIMIT = 30.0


def host_for(tmp_path: Path, root: Path) -> Host:
    return Host(load_settings(None, state_dir=tmp_path / "state", workdir_roots=[root]))


# -- the shipped example --------------------------------------------------------------------------


def test_the_example_goals_file_passes_the_loader_when_its_workdirs_exist_under_the_roots(tmp_path: Path) -> None:
    # The example's work directories lie under the roots of the example settings file...
    example = load_settings(CONFIG / "goald.example.toml", state_dir=tmp_path, default_model="scripted:demo")
    roots = example.workdir_roots
    assert [str(r) for r in roots] == ["/srv/goald/work"]
    text = (CONFIG / "goals.example.toml").read_text()
    # ...which this test moves into tmp_path.
    root = tmp_path / "srv" / "goald" / "work"
    copy = tmp_path / "goals.toml"
    copy.write_text(text.replace("/srv/goald/work", str(root)))
    host = host_for(tmp_path, root)

    # As its comments say, the work directory must exist before goald starts.
    with pytest.raises(GoalsFileError, match=r"goal 'nightly-report': workdir: '.*' does not exist"):
        check_declared(copy, host)
    (root / "nightly-report").mkdir(parents=True)
    declared = check_declared(copy, host)

    assert [g.key for g in declared.goals] == ["nightly-report"]
    assert declared.workdirs == {"nightly-report": root / "nightly-report"}
    assert declared.goals[0].budgets.max_rounds == 20 and declared.goals[0].verify[0].timeout == 60
    [nightly] = declared.schedules
    assert (nightly.key, nightly.timezone, nightly.misfire, nightly.concurrency) == (
        "nightly",
        "Europe/Berlin",
        "coalesce",
        "forbid",
    )
    assert nightly.trigger.model_dump() == {"kind": "cron", "expr": "0 3 * * *"}
    assert nightly.goal["budgets"] == {"max_rounds": 10}


# -- invalid files, in-process ----------------------------------------------------------------------

GOAL = '[[goal]]\nkey = "report"\nobjective = "Write the report."\n'
SCHEDULE = (
    '[[schedule]]\nkey = "nightly"\ntrigger = { kind = "cron", expr = "0 3 * * *" }\n'
    '[schedule.goal]\nobjective = "Refresh it."\n'
)

INVALID = [
    ('[[goal]\nkey = "report"\n', "not valid TOML: "),
    ("goals = []\n", "'goals': unknown key (the file holds [[goal]] and [[schedule]] entries)"),
    ('[goal]\nkey = "report"\n', "goal: must be an array of tables, written [[goal]]"),
    (GOAL + 'colour = "red"\n', "goal 'report': colour: unknown key"),
    (GOAL + "[goal.budgets]\nmax_round = 3\n", "goal 'report': budgets.max_round: unknown key"),
    ('[[goal]]\nkey = "report"\n', "goal 'report': objective: Field required"),
    ('[[goal]]\nkey = "report"\nobjective = "  "\n', "goal 'report': objective: must not be empty"),
    ('[[goal]]\nobjective = "x"\n', "goal #1: key: Field required"),
    (GOAL + 'workdir = "/elsewhere/report"\n', "goal 'report': workdir: '/elsewhere/report' is outside the allowed"),
    (GOAL + 'workdir = "relative"\n', "goal 'report': workdir: 'relative' must be an absolute path"),
    (GOAL + 'model = "nope:x"\n', "goal 'report': model: unknown model 'nope:x'"),
    (GOAL + GOAL, "goal 'report': key: declared twice (keys must be unique)"),
    (SCHEDULE.replace("0 3", "61 3"), "schedule 'nightly': trigger.expr: minute field: 61 is out of range 0-59"),
    (
        SCHEDULE.replace('key = "nightly"\n', 'key = "nightly"\nwhen = "later"\n'),
        "schedule 'nightly': when: unknown key",
    ),
    (
        SCHEDULE.replace('key = "nightly"\n', 'timezone = "Mars/Olympus"\nkey = "nightly"\n'),
        "timezone: unknown time zone",
    ),
    (SCHEDULE.replace('key = "nightly"\n', ""), "schedule #1: key: a declared schedule needs a key"),
    (SCHEDULE + 'model = "nope:x"\n', "schedule 'nightly': goal.model: unknown model 'nope:x'"),
    (SCHEDULE + 'key = "k"\n', "schedule 'nightly': goal: key cannot be set in a schedule's goal template"),
    (SCHEDULE + SCHEDULE, "schedule 'nightly': key: declared twice"),
]


@pytest.mark.parametrize(("text", "message"), INVALID)
def test_an_invalid_goals_file_is_refused_in_one_line_naming_the_entry_and_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "goals.toml"
    path.write_text(text)
    with pytest.raises(GoalsFileError) as exc:
        check_declared(path, host_for(tmp_path, tmp_path / "work"))
    assert str(exc.value).startswith(f"goals file {path}: ")
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)
    assert isinstance(exc.value, ConfigError)  # `goald serve` exits 78 on it


def test_a_missing_goals_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(GoalsFileError, match="cannot read it: No such file or directory"):
        check_declared(path, host_for(tmp_path, tmp_path / "work"))


# -- the real daemon ----------------------------------------------------------------------------------


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """``daemon(goals_text)``: a daemon (not started) whose goals file holds ``goals_text``."""
    made: list[Daemon] = []

    def make(goals_text: str) -> Daemon:
        goals = tmp_path / "goals.toml"
        goals.write_text(goals_text)
        # The goals' turns are slow: a short grace keeps a SIGTERM from waiting for them.
        d = Daemon(tmp_path / "state", config={**TEST_MODELS, "goals_file": str(goals), "shutdown_grace_seconds": 0.5})
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


def goals_file(d: Daemon) -> Path:
    return d.config_path.parent.parent / "goals.toml"


def store_files(d: Daemon) -> dict[str, str]:
    """Every file of the database (with its WAL, if any) by name, as a digest of its bytes."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(d.state_dir.glob("goald.db*"))
        if not p.name.endswith(".lock")  # the lock next to the database holds a PID, no data
    }


def reload(d: Daemon) -> str:
    """SIGHUP, then wait for the reload to end (systemd's protocol); returns the closing datagram."""
    assert d.proc is not None
    d.messages.clear()
    d.proc.send_signal(signal.SIGHUP)
    d.wait_message("RELOADING=1", LIMIT)
    return d.wait_message("READY=1", LIMIT)


def inline(value: Any) -> str:
    """``value`` as a TOML value (tables inline)."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {inline(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(inline(v) for v in value) + "]"
    return json.dumps(value)


def declared(goals: dict[str, dict[str, Any]], schedules: dict[str, dict[str, Any]]) -> str:
    """A goals file: ``[[goal]]`` and ``[[schedule]]`` entries by key."""
    entries = [("goal", k, v) for k, v in goals.items()] + [("schedule", k, v) for k, v in schedules.items()]
    return "".join(
        f"[[{kind}]]\n" + "".join(f"{name} = {inline(v)}\n" for name, v in {"key": key, **body}.items())
        for kind, key, body in entries
    )


def stable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a reload may change of goals or schedules, by id (the counters of a goal's run left out)."""
    fields = ("id", "key", "objective", "title", "budgets", "verify", "trigger", "timezone", "goal", "updatedAt")
    view = [{f: r[f] for f in fields if f in r} for r in rows]
    return sorted(view, key=lambda r: r["id"])


#: The goals' first model call takes 30 s: their rows do not change on their own during a test.
SLOW = "[rounds=50 delay=30]"
REPORT = {"objective": f"Write the report {SLOW}", "model": "test:worker", "budgets": {"max_rounds": 5}}
NIGHTLY = {"trigger": {"kind": "cron", "expr": "0 3 * * *"}, "goal": {"objective": "Refresh the report."}}


INVALID_AT_START = {
    "workdir outside the roots": (
        declared({"report": {**REPORT, "workdir": "/elsewhere/report"}}, {"nightly": NIGHTLY}),
        "goal 'report': workdir: '/elsewhere/report' is outside the allowed work-directory roots",
    ),
    "malformed TOML": (declared({"report": REPORT}, {}) + "[[schedule]\n", "not valid TOML: "),
    "unknown key": (
        declared({"report": REPORT}, {"nightly": {**NIGHTLY, "misfires": "skip"}}),
        "schedule 'nightly': misfires: unknown key",
    ),
}


@pytest.mark.parametrize("case", list(INVALID_AT_START))
def test_an_invalid_goals_file_refuses_to_start_with_exit_78_and_leaves_the_store_alone(
    daemon: Callable[..., Daemon], case: str
) -> None:
    text, message = INVALID_AT_START[case]
    d = daemon(declared({"report": REPORT}, {"nightly": NIGHTLY}))
    d.start()
    assert [g["key"] for g in d.cli_json("goal", "list")] == ["report"]
    assert d.terminate() == 0
    before = store_files(d)
    assert "goald.db" in before
    while d.pending_message() is not None:  # what the first run said
        pass

    goals_file(d).write_text(text)
    d.start(wait_ready=False)
    assert d.proc is not None
    assert d.proc.wait(LIMIT) == 78
    stderr = d.stderr()
    said = [line for line in stderr.splitlines() if line.startswith("goald:")]
    assert len(said) == 1, stderr
    assert said[0].startswith(f"goald: invalid configuration: goals file {goals_file(d)}: ")
    assert message in said[0]
    assert "Traceback" not in stderr
    assert store_files(d) == before  # not even opened
    assert d.pending_message() is None  # nor did it ever tell systemd anything


def test_an_invalid_goals_file_on_a_fresh_state_directory_creates_no_database(daemon: Callable[..., Daemon]) -> None:
    d = daemon(declared({"report": {**REPORT, "colour": "red"}}, {}))
    d.start(wait_ready=False)
    assert d.proc is not None
    assert d.proc.wait(LIMIT) == 78
    assert f"goald: invalid configuration: goals file {goals_file(d)}: goal 'report': colour: unknown key" in d.stderr()
    assert store_files(d) == {}


def test_sighup_with_an_invalid_goals_file_logs_it_changes_nothing_and_keeps_serving(
    daemon: Callable[..., Daemon],
) -> None:
    d = daemon(declared({"report": REPORT}, {"nightly": NIGHTLY}))
    d.start()
    goals_before = stable(d.cli_json("goal", "list"))
    schedules_before = stable(d.cli_json("schedule", "list"))

    # A valid change to the goal, and an invalid new schedule further down: all or nothing.
    changed = {"report": {**REPORT, "objective": f"Write a different report {SLOW}"}}
    goals_file(d).write_text(
        declared(
            changed, {"nightly": NIGHTLY, "broken": {**NIGHTLY, "trigger": {"kind": "cron", "expr": "0 25 * * *"}}}
        )
    )
    done = reload(d)
    problem = f"goals file {goals_file(d)}: schedule 'broken': trigger.expr: hour field: 25 is out of range 0-23"
    assert f"STATUS=reload failed: {problem}" in done.split("\n")
    errors = [line for line in d.stderr().splitlines() if "reload refused" in line]
    assert len(errors) == 1 and errors[0].endswith(f"reload refused, nothing was changed: {problem}")
    assert "ERROR" in errors[0] and "Traceback" not in d.stderr()

    assert stable(d.cli_json("goal", "list")) == goals_before
    assert stable(d.cli_json("schedule", "list")) == schedules_before
    health = d.cli_json("status")
    assert health["status"] == "serving"
    assert d.proc is not None and d.proc.poll() is None

    # Fixed, the same change goes through.
    goals_file(d).write_text(declared(changed, {"nightly": NIGHTLY}))
    assert "STATUS=reloaded 1 goal(s), 1 schedule(s)" in reload(d)
    [goal] = d.cli_json("goal", "list")
    assert (goal["id"], goal["key"]) == (goals_before[0]["id"], "report")
    assert goal["objective"] == f"Write a different report {SLOW}"


def test_sighup_reloads_declared_goals_and_schedules_by_key(daemon: Callable[..., Daemon]) -> None:
    d = daemon(declared({"report": REPORT}, {"nightly": NIGHTLY}))
    d.start()
    [report] = d.cli_json("goal", "list")
    [nightly] = d.cli_json("schedule", "list")
    assert (report["key"], report["objective"], report["budgets"]["maxRounds"]) == ("report", REPORT["objective"], 5)
    assert nightly["key"] == "nightly" and nightly["nextFireAt"].endswith("T03:00:00Z")

    assert report["progress"] is None
    edited_goal = {
        **REPORT,
        "objective": f"Write the weekly report {SLOW}",
        "budgets": {"max_rounds": 9},
        "progress": {"cmd": "cat status.txt", "timeout": 20},
    }
    edited_schedule = {**NIGHTLY, "trigger": {"kind": "cron", "expr": "15 4 * * *"}, "timezone": "Asia/Tokyo"}
    notes = {"objective": f"Keep notes {SLOW}", "model": "test:worker"}
    hourly = {"trigger": {"kind": "interval", "seconds": 3600}, "goal": {"objective": "Tidy up."}}
    goals_file(d).write_text(
        declared({"report": edited_goal, "notes": notes}, {"nightly": edited_schedule, "hourly": hourly})
    )
    assert "STATUS=reloaded 2 goal(s), 2 schedule(s)" in reload(d)

    goals = {g["key"]: g for g in d.cli_json("goal", "list")}
    assert sorted(goals) == ["notes", "report"]
    assert goals["report"]["id"] == report["id"]
    assert goals["report"]["objective"] == edited_goal["objective"]
    assert goals["report"]["budgets"]["maxRounds"] == 9
    assert goals["report"]["progress"] == {"cmd": "cat status.txt", "timeout": 20}
    assert goals["notes"]["objective"] == notes["objective"] and goals["notes"]["status"] == "active"
    schedules = {s["key"]: s for s in d.cli_json("schedule", "list")}
    assert sorted(schedules) == ["hourly", "nightly"]
    assert schedules["nightly"]["id"] == nightly["id"]
    assert schedules["nightly"]["trigger"] == {"kind": "cron", "expr": "15 4 * * *"}
    assert schedules["nightly"]["timezone"] == "Asia/Tokyo"
    assert schedules["nightly"]["nextFireAt"].endswith("T19:15:00Z")  # 04:15 in Tokyo
    assert schedules["hourly"]["trigger"]["kind"] == "interval"

    # The same file again changes nothing at all.
    assert "STATUS=reloaded 2 goal(s), 2 schedule(s)" in reload(d)
    assert stable(d.cli_json("goal", "list")) == stable(list(goals.values()))
    assert stable(d.cli_json("schedule", "list")) == stable(list(schedules.values()))


def test_config_check_checks_the_goals_file_and_writes_nothing(daemon: Callable[..., Daemon]) -> None:
    d = daemon(declared({"report": REPORT}, {"nightly": NIGHTLY}))
    good = d.cli("config", "check")
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["goals_file"] == str(goals_file(d))

    goals_file(d).write_text(declared({"report": {**REPORT, "colour": "red"}}, {}))
    bad = d.cli("config", "check")
    assert bad.returncode == 78
    assert f"goald: invalid configuration: goals file {goals_file(d)}: goal 'report': colour: unknown key" in bad.stderr
    assert bad.stdout == ""
    assert store_files(d) == {}
