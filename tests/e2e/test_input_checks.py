"""Mistakes are caught when they are typed: ``config check`` warns (``--strict`` refuses, exit 78),
``serve`` refuses an unusable state directory in one line (exit 78) and says what it created, and
``goal add`` / ``schedule add`` refuse a goal that could not run, naming the field, changing nothing.

Real processes throughout: the ``goald`` command and the daemon (``tests/harness.py``); the
read-only state directory is a real read-only mount (a tmpfs remounted read-only, as root).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import TEST_MODELS, Daemon, child_env, goald_argv, toml_text

pytestmark = pytest.mark.e2e


def goald(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*goald_argv(), *args], env=child_env(env), capture_output=True, text=True, timeout=timeout, check=False
    )


def warnings_of(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("goald: warning: ")]


# -- config check ---------------------------------------------------------------------------------


def test_config_check_warns_on_each_silent_mistake_and_strict_refuses(tmp_path: Path) -> None:
    goals = tmp_path / "goals.toml"
    goals.write_text(
        toml_text({})
        + '[[goal]]\nkey = "capped"\nobjective = "x"\nmodel = "scripted:demo"\n[goal.budgets]\nmax_cost = 1.0\n'
    )
    config = tmp_path / "goald.toml"
    config.write_text(
        toml_text(
            {
                "state_dir": str(tmp_path / "state"),
                "default_model": "nope:model",
                "workdir_roots": [str(tmp_path / "wrok")],  # a typo: no such directory
                "socket": str(tmp_path / "rnu" / "goald.sock"),
                "goals_file": str(goals),
                "providers": {"oa": {"kind": "openai", "api_key_env": "GOALD_TEST_UNSET_KEY"}},
            }
        )
    )
    done = goald("config", "check", "--config", str(config))
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)  # the effective settings still print, as before
    found = warnings_of(done.stderr)
    text = "\n".join(found)
    assert "providers.oa.api_key_env: environment variable GOALD_TEST_UNSET_KEY is not set" in text
    assert "default_model: 'nope:model': no provider 'nope' is configured" in text
    assert f"workdir_roots: {tmp_path / 'wrok'} does not exist" in text
    assert f"socket: directory {tmp_path / 'rnu'} does not exist" in text
    assert "goal 'capped': budgets.max_cost: model 'scripted:demo' has no price" in text
    assert len(found) == 5, found

    strict = goald("config", "check", "--strict", "--config", str(config))
    assert strict.returncode == 78, strict.stderr
    assert "5 warning(s), refused by --strict" in strict.stderr

    # The same configuration with every mistake fixed passes --strict.
    (tmp_path / "wrok").mkdir()
    (tmp_path / "rnu").mkdir()
    goals.write_text('[[goal]]\nkey = "capped"\nobjective = "x"\nmodel = "scripted:demo"\n')
    config.write_text(config.read_text().replace('"nope:model"', '"oa:gpt-4o-mini"'))
    fixed = goald("config", "check", "--strict", "--config", str(config), env={"GOALD_TEST_UNSET_KEY": "sk-test"})
    assert fixed.returncode == 0, fixed.stderr
    assert warnings_of(fixed.stderr) == []


def test_an_environment_override_is_named_as_such(tmp_path: Path) -> None:
    config = tmp_path / "goald.toml"
    config.write_text(toml_text({"state_dir": str(tmp_path / "state")}))
    done = goald("config", "check", "--config", str(config), env={"GOALD_MAX_CONCURRENT_TURNS": "abc"})
    assert done.returncode == 78
    assert "environment variable GOALD_MAX_CONCURRENT_TURNS" in done.stderr
    assert str(config) not in done.stderr  # the file is not blamed for it


# -- serve and the state directory ----------------------------------------------------------------


@contextlib.contextmanager
def read_only_mount(where: Path) -> Iterator[Path]:
    """A tmpfs at ``where`` holding a ``state`` directory, remounted read-only; unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only file system needs root")
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        (where / "state").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True, capture_output=True)
        yield where / "state"
    finally:
        subprocess.run(["umount", str(where)], check=True, capture_output=True)


def serve_once(tmp_path: Path, state_dir: Path) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "goald.toml"
    config.write_text(toml_text({"state_dir": str(state_dir)}))
    return goald("--config", str(config), "serve", timeout=60)


def test_serve_refuses_a_read_only_state_directory_in_one_line(tmp_path: Path) -> None:
    with read_only_mount(tmp_path / "ro") as state:
        done = serve_once(tmp_path, state)
    assert done.returncode == 78
    assert done.stderr.splitlines() == [
        f"goald: invalid configuration: state_dir {state} is not writable: read-only file system"
    ]


def test_serve_refuses_a_state_directory_under_a_file_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a directory\n")
    done = serve_once(tmp_path, tmp_path / "afile" / "state")
    assert done.returncode == 78
    assert done.stderr.splitlines() == [
        f"goald: invalid configuration: state_dir {tmp_path / 'afile' / 'state'} cannot be made:"
        f" {tmp_path / 'afile'} is a file, not a directory"
    ]
    done = serve_once(tmp_path, tmp_path / "afile")
    assert done.returncode == 78
    assert len(done.stderr.splitlines()) == 1 and "exists and is not a directory" in done.stderr


def test_serve_says_what_it_created(tmp_path: Path) -> None:
    root, runtime = tmp_path / "work-root", tmp_path / "rt"
    d = Daemon(tmp_path / "state", config={"workdir_roots": [str(root)], "socket": str(runtime / "goald.sock")})
    try:
        d.start()
        log = d.stderr()
        assert root.is_dir() and (runtime / "goald.sock").is_socket()
        assert f"configuration: workdir_roots: {root} does not exist" in log
        assert f"created the work-directory root {root}" in log
        assert f"created the control socket's directory {runtime}" in log
        assert d.terminate() == 0
    finally:
        d.close()


# -- goal add and schedule add ----------------------------------------------------------------


async def test_goal_and_schedule_add_refuse_what_could_not_run(daemon: Daemon) -> None:
    d = daemon

    async def refused(*args: str) -> str:
        code, out, err = await d.acli(*args)
        assert code == 2, (args, code, out, err)
        return err

    err = await refused("goal", "add", "x", "--model", "nope:x")
    assert "model: 'nope:x': no provider 'nope' is configured" in err
    err = await refused("goal", "add", "x", "--model", "test:worker", "--verify", "pytset -q")
    assert "verify[0].cmd: program 'pytset' is not on the sandbox's PATH" in err
    err = await refused("goal", "add", "x", "--model", "test:worker", "--progress", "/no/such/program --flag")
    assert "progress.cmd: program /no/such/program does not exist" in err
    err = await refused("goal", "add", "x", "--model", "scripted:demo", "--max-cost", "1")
    assert "budgets.maxCost: model 'scripted:demo' has no price" in err
    err = await refused("schedule", "add", "--every", "60", "x", "--model", "nope:x")
    assert "goal.model: 'nope:x': no provider 'nope' is configured" in err
    err = await refused("schedule", "add", "--every", "60", "x", "--model", "test:worker", "--verify", "mkae test")
    assert "goal.verify[0].cmd: program 'mkae'" in err
    err = await refused("schedule", "add", "--at", "tomorrow", "x")
    assert "--at 'tomorrow' is not an ISO 8601 date-time" in err and "--deadline" not in err
    # Nothing was written by any of them.
    assert (await d.acli_json("goal", "list")) == []
    assert (await d.acli_json("schedule", "list")) == []

    # What can run is accepted: a program on the sandbox's PATH, a shell construct, a priced model.
    made = await d.acli_json(
        "goal", "add", "ok [rounds=1]", "--model", "test:worker", "--verify", "test -f round1.txt", "--max-cost", "5"
    )
    assert made["goalId"].startswith("goal_")


async def test_an_unknown_goal_gets_a_plain_answer(daemon: Daemon) -> None:
    code, _out, err = await daemon.acli("goal", "pause", "Slow")
    assert code == 3, err
    assert err.startswith("goald: no goal") and "String should" not in err and "pydantic" not in err


async def test_a_provider_added_by_a_reload_needs_a_restart(tmp_path: Path) -> None:
    goals = tmp_path / "goals.toml"
    goals.write_text("")
    d = Daemon(tmp_path / "state", config={**TEST_MODELS, "goals_file": str(goals)})
    try:
        d.start()
        # The operator adds a provider to the configuration and a declared goal that uses it.
        d.config_path.write_text(d.config_path.read_text() + '[providers.fresh]\nkind = "openai"\n')
        goals.write_text('[[goal]]\nkey = "new"\nobjective = "x"\nmodel = "fresh:gpt-4o-mini"\n')
        assert d.proc is not None
        d.proc.send_signal(signal.SIGHUP)
        status = await asyncio.to_thread(_reload_outcome, d)
        assert "provider 'fresh' was added to" in status and "needs a restart" in status, status
        assert "unknown model" not in status
        assert "these need a restart" in d.stderr()  # the log names what a reload does not apply
        code, _out, err = await d.acli("goal", "add", "x", "--model", "fresh:gpt-4o-mini")
        assert code == 2 and "needs a restart" in err, err
        assert d.terminate() == 0
    finally:
        d.close()


def _reload_outcome(d: Daemon) -> str:
    """The STATUS= of the READY=1 that ends a reload (systemd's reload protocol)."""
    d.wait_message("RELOADING=1")
    while True:
        msg = d.next_message(30, waiting_for="READY=1 after the reload")
        fields = msg.split("\n")
        if "READY=1" in fields:
            return next((f for f in fields if f.startswith("STATUS=")), "")
