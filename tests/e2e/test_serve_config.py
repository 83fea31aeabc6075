"""``goald serve`` without flags reads the configuration the CLI and ``config check`` read (issue 27).

An unprivileged user (made with ``useradd``; the test runs as root, as CI does) with a
``~/.config/goald/goald.toml`` starts ``goald serve`` with no ``--config``: the daemon serves on
the state directory that file names, and its first info line names the goald version and the file.
Without the file it says it runs on built-in defaults and where it looked.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import child_env, goald_argv

from daemon import __version__
from daemon.cli.main import SYSTEM_CONFIG

USER = "goald-test-config"
LIMIT = 30.0


@pytest.fixture(params=["unprivileged", "root"])
def user_home(request: pytest.FixtureRequest) -> Iterator[tuple[str, Path]]:
    """A user with a home of its own: an unprivileged one made for the test with ``useradd`` (as
    root) and removed after, or root with another ``HOME`` (which reads the per-user file when
    there is no ``/etc/goald/goald.toml``)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the test makes an unprivileged user with useradd")
    home = Path(tempfile.mkdtemp(prefix="goald-home-", dir="/tmp"))
    if request.param == "root":
        if SYSTEM_CONFIG.exists():
            pytest.skip(f"{SYSTEM_CONFIG} exists: root's goald serve reads it first")
        try:
            yield "root", home
        finally:
            shutil.rmtree(home, ignore_errors=True)
        return
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/sh", USER], check=True)
    entry = pwd.getpwnam(USER)
    os.chown(home, entry.pw_uid, entry.pw_gid)
    os.chmod(home, 0o700)
    try:
        try:
            probe = [sys.executable, "-c", "import daemon"]
            subprocess.run(probe, user=USER, env=child_env(), cwd=str(home), check=True)
        except (PermissionError, subprocess.CalledProcessError) as exc:
            pytest.skip(f"this interpreter ({sys.executable}) cannot be run by another user here: {exc}")
        yield USER, home
    finally:
        subprocess.run(["userdel", USER], check=False)
        shutil.rmtree(home, ignore_errors=True)


def serve_as(user: str, home: Path, stderr_path: Path) -> subprocess.Popen[bytes]:
    """``goald serve`` with no flags, as ``user`` with ``home``: no ``GOALD_CONFIG``, no ``XDG_*``."""
    env = {k: v for k, v in child_env({"HOME": str(home), "USER": user}).items() if not k.startswith("XDG_")}
    with open(stderr_path, "wb") as stderr:
        return subprocess.Popen(
            [*goald_argv(), "serve"],
            user=user,
            group=pwd.getpwnam(user).pw_gid,
            extra_groups=[],
            env=env,
            cwd=str(home),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )


def wait_for(proc: subprocess.Popen[bytes], stderr_path: Path, what: str, ready: Path) -> str:
    """The daemon's stderr once it holds ``what`` and ``ready`` exists (fail on exit or timeout)."""
    deadline = time.monotonic() + LIMIT
    while True:
        text = stderr_path.read_text(errors="replace")
        if what in text and ready.exists():
            return text
        assert proc.poll() is None, f"goald serve exited {proc.returncode}:\n{text}"
        assert time.monotonic() < deadline, f"no {what!r} and {ready} within {LIMIT}s:\n{text}"
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(LIMIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_serve_reads_the_users_config_and_says_so(user_home: tuple[str, Path]) -> None:
    user, home = user_home
    config = home / ".config" / "goald" / "goald.toml"
    state = home / "chosen-state"
    uid, gid = pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid
    for directory in (home / ".config", config.parent):
        directory.mkdir()
        os.chown(directory, uid, gid)
    config.write_text(f'state_dir = "{state}"\nlog_level = "INFO"\n')
    os.chown(config, uid, gid)

    checked = subprocess.run(
        [*goald_argv(), "config", "check"],
        user=user,
        env={**child_env({"HOME": str(home)})},
        cwd=str(home),
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0 and str(state) in checked.stdout, checked  # config check read that file

    proc = serve_as(user, home, home / "stderr.log")
    try:
        expected = f"goald {__version__} starting with the configuration {config}"
        text = wait_for(proc, home / "stderr.log", expected, state / "goald.sock")
        assert (state / "goald.sock").stat().st_uid == uid
    finally:
        stop(proc)
    assert "built-in defaults" not in text


def test_serve_without_a_config_says_it_runs_on_defaults(user_home: tuple[str, Path]) -> None:
    user, home = user_home
    proc = serve_as(user, home, home / "stderr.log")
    looked = f"{SYSTEM_CONFIG} or " if user == "root" else ""
    defaults = f"goald {__version__} starting with built-in defaults: no config file at "
    expected = f"{defaults}{looked}{home}/.config/goald/goald.toml"
    try:
        text = wait_for(proc, home / "stderr.log", expected, home / ".local" / "state" / "goald" / "goald.sock")
    finally:
        stop(proc)
    assert "/etc/goald" not in text.split(expected)[0]
