"""One goal shape: a field added to :class:`goals.GoalSpec` reaches the protocol, the store and
``goald goal show`` with no other edit than its migration (docs/architecture.md#one-goal-shape).

The test copies the package (``agent/``, ``goals/``, ``daemon/``) to a temporary directory, adds
one field with a default to ``GoalSpec`` in the copy and one migration to the copy's
``goals/schema.py``, and runs a real ``goald`` from the copy (``PYTHONPATH`` pointing at it): a goal
created with the new field set (camelCase on the wire) shows it in its ``goal/describe`` answer,
in its ``goals`` row (a column of that name) and in the copy's ``goald goal show``; a goal created
without it has the default in the row and the answer. The files a new field touches: 2
(``goals/model.py`` and ``goals/schema.py``).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from harness import ROOT, TEST_MODELS, TESTS, Daemon, child_env, rpc

from daemon.rpc.protocol import RpcError

pytestmark = pytest.mark.e2e

#: The field the copy's GoalSpec gains, as it would be written by the next engineer.
FIELD = """
    #: Which reviewer's queue the goal's result goes to (added by the goal-shape test).
    review_queue: str = Field(default="none", max_length=100)
"""
#: Its migration, written as the ones before it.
MIGRATION = """    Migration(
        version={version},
        summary="the goal-shape test's field: the review queue a goal's result goes to",
        sql="ALTER TABLE goals ADD COLUMN review_queue TEXT NOT NULL DEFAULT 'none';",
    ),
"""


def _copy_with_field(dest: Path) -> list[str]:
    """Copy the package to ``dest`` and add the field and its migration; returns the files edited."""
    for package in ("agent", "goals", "daemon"):
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    model = dest / "goals" / "model.py"
    text = model.read_text()
    # The field goes after the spec's last field, before its first validator.
    spec_at = text.index("class GoalSpec(")
    last = text.index("\n\n    @field_validator", spec_at)
    model.write_text(text[:last] + "\n" + FIELD.rstrip("\n") + text[last:])
    schema = dest / "goals" / "schema.py"
    text = schema.read_text()
    version = max(int(v) for v in re.findall(r"version=(\d+)", text)) + 1
    end = text.index("\n]\n", text.index("MIGRATIONS = [")) + 1
    schema.write_text(text[:end] + MIGRATION.format(version=version) + text[end:])
    return ["goals/model.py", "goals/schema.py"]


def test_a_field_added_to_the_spec_reaches_the_protocol_the_store_and_goal_show(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    edited = _copy_with_field(copy)
    assert len(edited) == 2  # the model and a migration: nothing else (docs/architecture.md says 2)
    # PYTHONSAFEPATH: ``python -m`` puts no working directory (the repository's, under pytest)
    # before the copy on the path.
    env = {"PYTHONPATH": f"{copy}:{TESTS}", "PYTHONSAFEPATH": "1"}

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *argv], env=child_env(env), cwd=copy, capture_output=True, text=True, timeout=60
        )

    # The copy is what runs: its GoalSpec has the field, the repository's does not.
    probe = run("-c", "import goals.model as m; print(m.__file__, 'review_queue' in m.GoalSpec.model_fields)")
    assert probe.stdout.split() == [str(copy / "goals" / "model.py"), "True"], probe.stderr

    d = Daemon(tmp_path / "state", config=TEST_MODELS)
    try:
        d.start(extra_env=env)
        sock = d.socket_path
        given = asyncio.run(
            rpc(sock, "goal/create", {"objective": "review me", "model": "test:worker", "reviewQueue": "security"})
        )
        plain = asyncio.run(rpc(sock, "goal/create", {"objective": "plain", "model": "test:worker"}))

        # The protocol: goal/describe's goal view carries it, camelCase.
        described = asyncio.run(rpc(sock, "goal/describe", {"goalId": given["goalId"]}))
        assert described["goal"]["reviewQueue"] == "security"
        assert asyncio.run(rpc(sock, "goal/get", {"goalId": plain["goalId"]}))["reviewQueue"] == "none"
        # A bad value is refused naming the field, and nothing is made.
        with pytest.raises(RpcError, match="reviewQueue"):
            asyncio.run(rpc(sock, "goal/create", {"objective": "x", "model": "test:worker", "reviewQueue": "q" * 101}))
        assert len(asyncio.run(rpc(sock, "goal/list", {}))["goals"]) == 2

        # The store: a column of its name holds it.
        with sqlite3.connect(f"file:{d.state_dir / 'goald.db'}?mode=ro", uri=True) as conn:
            rows = dict(conn.execute("SELECT id, review_queue FROM goals").fetchall())
        assert rows == {given["goalId"]: "security", plain["goalId"]: "none"}

        # goald goal show (the copy's CLI) names it; the default is not shown.
        def show(*args: str) -> str:
            done = run("-m", "daemon", "--config", str(d.config_path), "goal", "show", *args)
            assert done.returncode == 0, done.stderr
            return done.stdout

        assert "reviewQueue: security" in show(given["goalId"]).splitlines()
        assert "reviewQueue" not in show(plain["goalId"])
        assert json.loads(show(plain["goalId"], "--json"))["reviewQueue"] == "none"
    finally:
        d.close()
