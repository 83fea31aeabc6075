"""The sandbox issue's shell-only attacks, through the real daemon and the scripted model.

``goald serve`` runs as root here (CI does), so its commands run as the sandbox user. The model
``attacker`` (``tests/sandbox_testmodels.py``) tries, one shell call each: the climb through a
descriptor of the work directory to the host's root, a set-user-ID copy of ``id`` left for another
local user, and the kernel keyring (reading the session keyring the daemon was started with, which
holds a key this test put there, and adding its own). Each is refused, and seen refused from
outside: no file beside the work directory, no set-id bit, another user (made with ``useradd``)
can neither reach nor run the copy, and the keyring lists nothing and its calls are killed.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import TEST_MODELS, Daemon, all_events, child_env, goald_argv, rpc, toml_text, wait_goal

from agent.sandbox.seccomp import VIOLATION

pytestmark = pytest.mark.needs_bwrap
LIMIT = 60.0
OTHER = "goald-test-other"


@pytest.fixture
def other_user() -> Iterator[str]:
    """Another local user, made for the test (as root) and removed after."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the test makes another local user with useradd")
    try:
        pwd.getpwnam(OTHER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", OTHER], check=True)
    yield OTHER
    subprocess.run(["userdel", OTHER], check=False)


def as_user(user: str, argv: list[str]) -> subprocess.CompletedProcess[str] | None:
    """``argv`` run as ``user``; ``None`` when it could not even be started (not reachable)."""
    try:
        return subprocess.run(argv, user=user, capture_output=True, text=True, check=False)
    except PermissionError:
        return None  # the work-directory root is 0710, its group the sandbox user's


def add_session_key(description: bytes, payload: bytes) -> int:
    """A key in this process's session keyring (the daemon it starts inherits that keyring)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    key = libc.syscall(248, b"user", description, payload, len(payload), -3)  # add_key, KEY_SPEC_SESSION_KEYRING
    if key < 0:
        pytest.skip(f"the kernel keyring cannot be used here (errno {ctypes.get_errno()})")
    return int(key)


async def test_the_shell_attacks_are_refused(tmp_path: Path, other_user: str) -> None:
    add_session_key(b"goald-test-secret", b"the-daemons-key")
    config: dict[str, Any] = {
        "providers": {**TEST_MODELS["providers"], "sbx": {"kind": "scripted", "script": "sandbox_testmodels:models"}},
    }
    d = Daemon(tmp_path / "state", config=config)
    try:
        d.start()
        goal = await rpc(d.socket_path, "goal/create", {"objective": "attack", "model": "sbx:attacker"})
        await wait_goal(d.socket_path, goal["goalId"], {"completed", "paused", "exhausted"}, LIMIT)
        events = await all_events(d.socket_path, goal["sessionId"])
        workdir = Path((await rpc(d.socket_path, "goal/get", {"goalId": goal["goalId"]}))["workdir"])
    finally:
        d.close()
    results = [e["data"]["content"] for e in events if e["type"] == "tool/result"]
    assert len(results) == 3, results
    climb, setuid, keyring = results
    # 1. The climb: the command holds descriptors 0, 1 and 2 only (and ls's own), none leads out.
    assert "CLIMBED" not in climb and "WROTE" not in climb, climb
    assert "climb-done" in climb
    assert not (workdir.parent / "escaped").exists()
    assert not (workdir.parent.parent / "escaped").exists()
    # 2. Set-user-ID: the chmod is killed, the copy keeps no set-id bit and belongs to the sandbox
    # user, and another user can neither reach it nor gain anything by running it.
    assert VIOLATION in setuid, setuid
    copy = workdir / "id2"
    st = copy.stat()
    assert st.st_mode & 0o6000 == 0
    assert st.st_uid != 0 and st.st_uid == pwd.getpwnam("goald-sandbox").pw_uid
    ran = await asyncio.to_thread(as_user, other_user, [str(copy), "-u"])
    assert ran is None or ran.stdout.strip() != "0", "another user ran the copy as root"
    reach = await asyncio.to_thread(as_user, other_user, ["test", "-x", str(copy)])
    assert reach is None or reach.returncode != 0, "another user can reach the goal's files"
    # 3. The keyring: nothing listed, keyctl and add_key killed, and the session keyring unchanged.
    assert keyring.split("--- stdout ---\n")[1].split()[0] == "0", keyring
    assert VIOLATION in keyring, keyring
    assert "Bad system call" in keyring


def test_goald_run_by_hand_as_root_runs_commands_as_the_sandbox_user(outside: Path) -> None:
    """``goald run`` started as root (by hand, no unit) gives the guarantee ``goald serve`` gives:
    its commands run as the sandbox user, never as root, and what they make is that user's."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a daemon that is not root runs commands as itself")
    config = outside / "goald.toml"
    config.write_text(toml_text({"providers": {"sbx": {"kind": "scripted", "script": "sandbox_testmodels:models"}}}))
    state = outside / "state"
    done = subprocess.run(
        [*goald_argv(), "--config", str(config), "run", "--model", "sbx:whoami", "--state-dir", str(state), "who?"],
        env=child_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )
    assert done.returncode == 0, done.stderr
    user = pwd.getpwnam("goald-sandbox")
    assert done.stdout.split() == ["exit", "code:", "0", "---", "stdout", "---", str(user.pw_uid), str(user.pw_gid)]
    [made] = list(state.rglob("made-by-the-command"))
    assert (made.stat().st_uid, made.stat().st_gid) == (user.pw_uid, user.pw_gid)
