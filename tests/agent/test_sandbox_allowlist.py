"""What a command sees from ``shell`` under the daemon's sandbox profile: an allowlist of system
directories without the host's secrets, its own work directory, the goal's extra read-only paths,
and nothing of the configuration, the state directory, the credentials, ``/root`` or ``/home``.

The daemon-like layout lives under ``/var/tmp`` (not ``/tmp``, which the sandbox replaces anyway).
To show that a hidden path is hidden because it is listed, and not only because nothing around it
is shown, the whole layout is also given as a daemon-wide read-only path: the configuration file,
the credentials and the state directory are then inside something shown, and must still be covered.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from agent import Shell, ToolContext
from agent.allowlist import ETC_SECRETS, SYSTEM_PATHS, etc_secrets, mounts
from agent.sandbox.identity import hand_over
from daemon.settings import load_settings, sandbox_profile

needs_bwrap = pytest.mark.needs_bwrap
TOKEN = "tok-allowlist-4c1d9e-not-for-models"


def run_in(shell: Shell, workdir: Path, line: str) -> str:
    import asyncio

    ctx = ToolContext(session_id="s", turn_id="t", call_id="c", workdir=workdir)
    return asyncio.run(shell.run(shell.Args(command=line), ctx)).content


@needs_bwrap
def test_shell_sees_the_allowlist_and_none_of_the_daemons_secrets(
    outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = outside / "layout"
    config_dir, creds, state, tool = layout / "etc", layout / "creds", layout / "state", outside / "toolchain"
    for d in (config_dir, creds, state / "work" / "g", tool / "bin"):
        d.mkdir(parents=True)
    (creds / "openai-api-key").write_text(TOKEN)
    (state / "goald.db").write_text("database " + TOKEN)
    (tool / "bin" / "tc").write_text("#!/bin/sh\necho toolchain works\n")
    (tool / "bin" / "tc").chmod(0o755)
    config = config_dir / "goald.toml"
    config.write_text(
        f'state_dir = "{state}"\n'
        f'sandbox_read_only_paths = ["{layout}"]\n'
        f'[mcp_servers.files]\ncommand = ["true"]\nenv = {{ TOKEN = "{TOKEN}" }}\n'
        f'[goal_sandbox.builder]\nread_only_paths = ["{tool}"]\n'
    )
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    profile = sandbox_profile(load_settings(config))
    workdir = state / "work" / "g"
    hand_over(workdir, profile.user)  # as daemon.workdirs does: a root daemon's commands run as the sandbox user
    plain = Shell(lambda ctx: profile.sandbox(workdir))
    builder = Shell(lambda ctx: profile.sandbox(workdir, "builder"))

    def probe(path: Path | str) -> str:
        # A covered file reads as /dev/null (empty), a covered directory lists nothing.
        read = f'[ -n "$(head -c 1 {path} 2>/dev/null)" ] || {{ [ -d {path} ] && ls -A {path} | grep -q .; }}'
        return f"if {read}; then echo 'READ {path}'; fi"

    homes = [str(p) for p in Path("/home").iterdir()] if Path("/home").is_dir() else []
    targets = [
        config,
        "/etc/shadow",
        "/etc/gshadow",
        "/root",
        "/root/.ssh",
        *homes,
        "/home",
        creds / "openai-api-key",
        creds,
        state / "goald.db",
        "/run/credentials",
        "/run/user",
        "/var/lib",
    ]
    out = run_in(plain, workdir, "; ".join(probe(t) for t in targets) + "; echo checked")
    assert out == "exit code: 0\n--- stdout ---\nchecked", out
    assert TOKEN not in out
    # The probe does see what is there to see.
    seen = run_in(plain, workdir, f"{probe('/etc/passwd')}; {probe('/usr/bin')}; {probe(layout)}")
    assert seen == f"exit code: 0\n--- stdout ---\nREAD /etc/passwd\nREAD /usr/bin\nREAD {layout}"
    # The root holds the allowlist and the parents of what is shown (here /var, down to the layout).
    top = run_in(plain, workdir, "ls -A /").split("--- stdout ---\n")[1].split()
    allowed = {Path(p).name for p in SYSTEM_PATHS} | {"tmp", "proc", "dev", "var"}
    assert set(top) <= allowed, top
    assert {"usr", "etc", "tmp", "proc", "dev"} <= set(top)
    assert not {"root", "home", "run", "srv", "opt", "mnt", "boot"} & set(top)
    # Work directory writable; the system and the extra paths not.
    written = run_in(plain, workdir, f"echo x > mine.txt && cat mine.txt; touch /usr/x {layout}/x 2>&1 | wc -l")
    assert written == "exit code: 0\n--- stdout ---\nx\n2"
    # A toolchain given to one goal is there for that goal's commands only.
    assert run_in(builder, workdir, f"{tool}/bin/tc") == "exit code: 0\n--- stdout ---\ntoolchain works"
    assert "No such file" in run_in(plain, workdir, f"{tool}/bin/tc")


def test_etc_secrets_cover_the_named_ones_and_whatever_others_cannot_read() -> None:
    hidden = set(etc_secrets())
    for name in ("/etc/shadow", "/etc/gshadow", "/etc/sudoers"):
        if os.path.lexists(name):
            assert Path(name) in hidden
    for top, _dirs, files in os.walk("/etc"):
        for f in files:
            path = Path(top) / f
            try:
                mode = path.lstat().st_mode
            except OSError:
                continue
            if path.is_file() and not path.is_symlink() and not mode & 0o004:
                assert any(path == h or path.is_relative_to(h) for h in hidden), path
    assert "/etc/goald" in ETC_SECRETS


def test_mounts_refuse_a_missing_extra_path_and_keep_symlinked_system_dirs(tmp_path: Path) -> None:
    from agent.allowlist import MountError

    with pytest.raises(MountError, match="does not exist"):
        mounts(tmp_path, [tmp_path / "nope"])
    with pytest.raises(MountError, match="not absolute"):
        mounts(tmp_path, [Path("relative")])
    args = mounts(tmp_path)
    for name in SYSTEM_PATHS:
        if os.path.islink(name):
            i = args.index(name)
            assert args[i - 2 : i + 1] == ["--symlink", os.readlink(name), name]
    assert args[-2:] == ["--remount-ro", "/"]


def test_an_etc_entry_made_unreadable_after_start_is_hidden_when_etc_changes() -> None:
    before = etc_secrets()
    path = Path(tempfile.mkstemp(prefix="goald-late-secret-", dir="/etc")[1])  # a new entry: /etc's mtime moves
    try:
        os.chmod(path, 0o600)
        assert path not in before
        assert path in etc_secrets()
    finally:
        path.unlink()


def test_a_commands_mounts_cover_a_secret_added_to_etc_after_the_last_command(tmp_path: Path) -> None:
    # The mount plan keeps what it resolved of /etc while /etc and the directories its secrets are
    # in do not change; a new entry changes /etc, so the next command's mounts cover it.
    mounts(tmp_path)
    path = Path(tempfile.mkstemp(prefix="goald-late-secret-", dir="/etc")[1])
    try:
        os.chmod(path, 0o600)
        args = mounts(tmp_path)
        i = args.index(str(path))
        assert args[i - 2 : i + 1] == ["--ro-bind", "/dev/null", str(path)]
    finally:
        path.unlink()
    assert str(path) not in mounts(tmp_path)
