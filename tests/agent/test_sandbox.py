"""The sandbox, with the real bubblewrap: what a command can see, write, reach and leave behind.

The directories to hide live outside ``/tmp`` (under ``/var/tmp``): the sandbox's private ``/tmp``
would hide anything under the host's ``/tmp`` anyway, and these tests must show that each hidden
path is hidden because it is listed. Every test that needs bwrap is skipped, with the reason, when
it cannot make a sandbox here.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from typing import Any

import pytest
from sandboxkit import NO_BWRAP, bwrap

from agent import (
    Bwrap,
    Redactor,
    Sandbox,
    SandboxPolicy,
    SandboxProfile,
    SandboxUnavailable,
    detect_bwrap,
)
from agent.sandbox.capture import Capture as _Capture

needs_bwrap = pytest.mark.needs_bwrap
SECRET = "tok-5f0c2e-very-secret-9d1b"


@pytest.fixture
def layout(outside: Path) -> dict[str, Path]:
    """A daemon-like layout: state dir with a database, a credentials dir, two goals' work dirs."""
    state = outside / "state"
    creds = outside / "creds"
    mine = state / "work" / "mine"
    other = state / "work" / "other"
    for d in (creds, mine, other):
        d.mkdir(parents=True)
    (state / "goald.db").write_text("database bytes")
    (creds / "openai-api-key").write_text(SECRET)
    (other / "notes.txt").write_text("the other goal's file\n")
    return {"state": state, "creds": creds, "mine": mine, "other": other, "root": state / "work"}


def sandbox(layout: dict[str, Path], **kw: Any) -> Sandbox:
    return Sandbox(
        layout["mine"],
        hidden=(layout["state"], layout["creds"], layout["root"]),
        bwrap=bwrap().path if NO_BWRAP is None else "bwrap",
        disable_userns=bwrap().disable_userns if NO_BWRAP is None else True,
        kill_grace=0.5,
        **kw,
    )


async def sh(box: Sandbox, line: str, *, limit: float = 20.0, cap: int = 64_000) -> tuple[int | None, str, str]:
    result = await box.run(["bash", "-c", line], timeout=limit, output_cap=cap)
    return result.exit_code, result.stdout, result.stderr


# -- the command line ---------------------------------------------------------------------------


def test_argv_lists_namespaces_and_keeps_secrets_off_the_command_line(layout: dict[str, Path]) -> None:
    box = sandbox(layout, secrets={"GIT_TOKEN": SECRET}, env={"MODE": "test"})
    argv = box.argv(["bash", "-c", "true"], secrets_fd=7)
    for flag in ("--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net"):
        assert flag in argv
    assert "--unshare-all" not in argv and "--unshare-cgroup" not in argv
    for flag in ("--die-with-parent", "--new-session", "--clearenv"):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert argv[argv.index("--args") + 1] == "7"
    assert argv[-4:] == ["--", "bash", "-c", "true"]
    assert not any(SECRET in a for a in argv)
    i = argv.index("--setenv")
    assert argv[i : i + 3] == ["--setenv", "PATH", box.environment()["PATH"]]
    # An allowlist, not the root: the state directory is not mounted at all (it is not shown), the
    # work directory is bound inside it, and the sandbox's root is made read-only last.
    assert not any(argv[i : i + 3] == ["--ro-bind", "/", "/"] for i in range(len(argv)))
    assert argv[argv.index("/usr") - 1 : argv.index("/usr") + 2] == ["--ro-bind", "/usr", "/usr"]
    assert str(layout["state"]) not in argv
    assert argv[argv.index("--bind") + 1] == str(layout["mine"])
    assert argv[argv.index("--chdir") - 2 : argv.index("--chdir")] == ["--remount-ro", "/"]
    on = sandbox(layout, network=True).argv(["true"])
    assert "--unshare-net" not in on and "--unshare-pid" in on
    assert Sandbox.none(layout["mine"]).argv(["bash", "-c", "x"]) == ["bash", "-c", "x"]


def test_invalid_sandboxes_are_refused(layout: dict[str, Path]) -> None:
    with pytest.raises(SandboxUnavailable, match="hidden paths"):
        Sandbox(layout["state"], hidden=(layout["state"],)).argv(["true"])
    with pytest.raises(SandboxUnavailable, match="set by the sandbox"):
        Sandbox(layout["mine"], secrets={"PATH": "/evil"})
    with pytest.raises(SandboxUnavailable, match="not a valid"):
        Sandbox(layout["mine"], env={"A B": "x"})
    with pytest.raises(SandboxUnavailable, match="absolute"):
        Sandbox(Path("relative"))
    assert SECRET not in repr(Sandbox(layout["mine"], secrets={"T": SECRET}))


def test_detect_names_a_missing_bwrap() -> None:
    with pytest.raises(SandboxUnavailable, match="not installed"):
        detect_bwrap("goald-no-such-bwrap")


# -- what a command sees and can do --------------------------------------------------------------


@needs_bwrap
async def test_root_is_read_only_and_only_the_workdir_and_a_private_tmp_are_writable(
    layout: dict[str, Path], outside: Path
) -> None:
    box = sandbox(layout)
    probe = outside / "probe.txt"
    probe.write_text("host\n")
    marker = f"goald-sbx-{os.getpid()}-{random.Random(1).randrange(10**9)}"
    code, out, err = await sh(
        box,
        f"echo in > {probe} ; echo in > /usr/{marker} ; echo mine > made.txt ; echo t > /tmp/{marker} ; "
        f"cat /tmp/{marker} ; echo HOME=$HOME TMPDIR=$TMPDIR PWD=$PWD",
    )
    assert "Read-only file system" in err
    assert probe.read_text() == "host\n"
    assert not _exists(f"/usr/{marker}")
    assert (layout["mine"] / "made.txt").read_text() == "mine\n"
    assert out.splitlines()[0] == "t"
    assert not _exists(f"/tmp/{marker}"), "the sandbox's /tmp is its own"
    assert f"HOME={layout['mine']} TMPDIR=/tmp PWD={layout['mine']}" in out
    assert code == 0


@needs_bwrap
async def test_hidden_paths_are_empty_read_only_and_other_workdirs_invisible(layout: dict[str, Path]) -> None:
    box = sandbox(layout)
    code, out, err = await sh(
        box,
        f"ls -A {layout['state']} ; ls -A {layout['root']} ; ls -A {layout['creds']} ; "
        f"cat {layout['state'] / 'goald.db'} ; cat {layout['creds'] / 'openai-api-key'} ; "
        f"cat {layout['other'] / 'notes.txt'} ; mkdir {layout['other']} ; "
        f"echo pwned > {layout['root'] / 'evil.txt'} ; echo pwned > ../evil.txt ; echo ok",
    )
    # Only the path down to the work directory exists; nothing of the real state directory does.
    assert out.split() == ["work", "mine", "ok"]
    assert err.count("No such file or directory") == 4
    assert err.count("Read-only file system") == 3
    assert SECRET not in out + err and "database bytes" not in out + err
    assert sorted(p.name for p in layout["root"].iterdir()) == ["mine", "other"]
    assert sorted(p.name for p in layout["other"].iterdir()) == ["notes.txt"]
    assert code == 0


@needs_bwrap
async def test_environment_is_scrubbed_and_secrets_are_redacted(
    layout: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOALD_TEST_PROVIDER_API_KEY", "sk-daemon-key-never-in-a-sandbox")
    box = sandbox(layout, secrets={"GIT_TOKEN": SECRET}, env={"MODE": "test"})
    code, out, err = await sh(
        box,
        'env | sort ; echo "token=$GIT_TOKEN" ; echo "$GIT_TOKEN" >&2 ; tr "\\0" " " < /proc/1/cmdline ; echo',
    )
    names = {line.split("=", 1)[0] for line in out.splitlines() if "=" in line and line[0].isupper()}
    assert {"PATH", "HOME", "LANG", "TMPDIR", "MODE", "GIT_TOKEN"} <= names
    assert "GOALD_TEST_PROVIDER_API_KEY" not in out
    assert "sk-daemon-key" not in out
    assert "token=[redacted]" in out and "GIT_TOKEN=[redacted]" in out
    assert err.strip() == "[redacted]"
    assert SECRET not in out + err
    # Process 1 of the sandbox is bwrap: its command line carries no secret (they came through a pipe).
    cmdline = [line for line in out.splitlines() if "bwrap" in line]
    assert cmdline and "--args" in cmdline[0] and "[redacted]" not in cmdline[0]
    assert code == 0


@needs_bwrap
async def test_a_fresh_pid_namespace_shows_none_of_the_host(layout: dict[str, Path]) -> None:
    code, out, _ = await sh(sandbox(layout), f"ls /proc | grep -c '^[0-9]' ; test -e /proc/{os.getpid()} ; echo $?")
    count, visible = out.split()
    assert int(count) <= 5  # bwrap's init, bash, ls, grep (and the subshell)
    assert visible == "1"
    assert code == 0


@needs_bwrap
async def test_network_off_cannot_reach_a_loopback_listener_and_on_can(layout: dict[str, Path]) -> None:
    accepted: list[str] = []
    got = asyncio.Event()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append("connected")
        got.set()
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    line = f"(echo hi > /dev/tcp/127.0.0.1/{port}) 2>&1 && echo REACHED || echo REFUSED"
    try:
        _, off, _ = await sh(sandbox(layout), line)
        assert "REFUSED" in off and accepted == []
        _, on, _ = await sh(sandbox(layout, network=True), line)
        assert "REACHED" in on
        async with asyncio.timeout(10):
            await got.wait()
        assert accepted == ["connected"]
    finally:
        server.close()
        await server.wait_closed()


@needs_bwrap
async def test_exit_codes_and_both_streams(layout: dict[str, Path]) -> None:
    result = await sandbox(layout).run(["bash", "-c", "echo out; echo err >&2; exit 7"], timeout=20)
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (7, "out\n", "err\n", False)
    killed = await sandbox(layout).run(["bash", "-c", "kill -KILL $$"], timeout=20)
    assert killed.exit_code == 128 + 9
    merged = await sandbox(layout).run(["bash", "-c", "echo a; echo b >&2"], timeout=20, merge_stderr=True)
    assert sorted(merged.stdout.split()) == ["a", "b"] and merged.stderr == ""


@needs_bwrap
async def test_the_main_process_exiting_ends_its_background_processes(layout: dict[str, Path]) -> None:
    marker = f"goald-bg-{os.getpid()}"
    result = await sandbox(layout).run(
        ["bash", "-c", f"(trap '' TERM HUP; exec -a {marker} sleep 600) >/dev/null 2>&1 & echo started"], timeout=20
    )
    assert result.stdout == "started\n" and result.exit_code == 0
    # No wait needed: the namespace is empty before bwrap can exit.
    assert _processes_named(marker) == []


@needs_bwrap
async def test_a_timeout_kills_the_whole_namespace_even_a_term_ignoring_grandchild(layout: dict[str, Path]) -> None:
    marker = f"goald-tmo-{os.getpid()}"
    line = f"(trap '' TERM; exec -a {marker} sleep 600) & trap '' TERM; echo ready; sleep 600"
    result = await sandbox(layout).run(["bash", "-c", line], timeout=0.5)
    assert result.timed_out and result.exit_code is None
    assert result.stdout == "ready\n"
    assert result.seconds >= 0.5 + 0.5  # SIGTERM was ignored; the kill came after the grace period
    assert _processes_named(marker) == []


@needs_bwrap
async def test_cancelling_a_run_kills_the_command(layout: dict[str, Path]) -> None:
    marker = f"goald-cxl-{os.getpid()}"
    fifo = layout["mine"] / "ready"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    ready = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(fd, ready.set)  # the command says it runs by writing to the FIFO
    try:
        task = asyncio.create_task(
            sandbox(layout).run(["bash", "-c", f"echo go > ready; exec -a {marker} sleep 600"], timeout=60)
        )
        async with asyncio.timeout(20):
            await ready.wait()
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    assert _processes_named(marker), "the command runs"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert _processes_named(marker) == []


def _processes_named(marker: str) -> list[int]:
    """PIDs whose command line contains ``marker`` (other than this test process)."""
    return [
        int(e)
        for e in os.listdir("/proc")
        if e.isdigit() and int(e) != os.getpid() and marker.encode() in _cmdline(int(e))
    ]


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


# -- unconfined --------------------------------------------------------------------------------


async def test_none_runs_in_its_own_group_with_a_scrubbed_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOALD_TEST_PROVIDER_API_KEY", "sk-daemon-key")
    box = Sandbox.none(tmp_path, secrets={"GIT_TOKEN": SECRET})
    result = await box.run(["bash", "-c", 'cut -d" " -f5 /proc/$$/stat ; echo "$GIT_TOKEN" ; env'], timeout=20)
    pgid = int(result.stdout.split()[0])
    assert pgid != os.getpgid(0)
    assert "[redacted]" in result.stdout and SECRET not in result.stdout
    assert "GOALD_TEST_PROVIDER_API_KEY" not in result.stdout
    assert f"HOME={tmp_path}" in result.stdout


async def test_none_timeout_kills_the_group_term_ignoring_grandchild_included(tmp_path: Path) -> None:
    marker = f"goald-none-{os.getpid()}"
    box = Sandbox.none(tmp_path, kill_grace=0.3)
    line = f"(trap '' TERM; exec -a {marker} sleep 600) & echo $! > child.pid; trap '' TERM; sleep 600"
    result = await box.run(["bash", "-c", line], timeout=0.5)
    assert result.timed_out
    await _exited(int((tmp_path / "child.pid").read_text()), marker)


async def _exited(pid: int, marker: str, limit: float = 10.0) -> None:
    """Wait (with a time limit) until ``pid`` — if it is still the process named ``marker`` — has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if marker.encode() not in _cmdline(pid):
            return  # a zombie has no command line; or the PID is not ours any more
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(fd, done.set)  # a pidfd reads ready when its process exits
        try:
            async with asyncio.timeout(limit):
                await done.wait()
        finally:
            loop.remove_reader(fd)
    finally:
        os.close(fd)


# -- output capture and redaction ----------------------------------------------------------------


def test_redactor_replaces_exact_values_longest_first() -> None:
    r = Redactor(["abcd", "abcdefgh", "xyz", ""])
    assert r.redact("1 abcdefgh 2 abcd 3 xyz") == "1 [redacted] 2 [redacted] 3 xyz"
    assert r.longest == 8 and bool(r) and not Redactor(["abc"])
    assert "abcd" not in repr(r)
    assert Redactor(["a.b*c"]).redact("xa.b*cx abbbc") == "x[redacted]x abbbc"
    assert Redactor(["one1"]).union(Redactor(["two2"])).redact("one1 two2") == "[redacted] [redacted]"


def test_capture_keeps_head_and_tail_and_never_leaves_a_piece_of_a_secret() -> None:
    rng = random.Random(20240607)
    # No letter of the secret occurs in the filler, the marker or "[redacted]": any one of them in
    # the output would be a piece of the secret.
    letters = "GHJKLMNPQVWXZ"
    secret = "".join(rng.choice(letters) for _ in range(24))
    redactor = Redactor([secret])
    for _ in range(500):
        cap = rng.randrange(8, 200)
        parts = []
        for _ in range(rng.randrange(1, 6)):
            parts.append("".join(rng.choice("xyz \n") for _ in range(rng.randrange(0, 300))))
            parts.append(secret)
        data = "".join(parts).encode()
        capture = _Capture(cap, redactor.longest)
        i = 0
        while i < len(data):
            step = rng.randrange(1, 64)
            capture.feed(data[i : i + step])
            i += step
        text = capture.text(redactor)
        assert capture.total == len(data)
        assert not set(letters) & set(text), (cap, text)
        if len(data) <= cap:
            assert text == redactor.redact(data.decode())
        else:
            assert f"[... output truncated: {len(data)} bytes in all; the middle is not shown ...]" in text
            assert len(text) <= cap + 80


@needs_bwrap
async def test_output_over_the_cap_is_cut_in_the_middle_with_a_marker(layout: dict[str, Path]) -> None:
    line = "echo first-line; head -c 300000 /dev/zero | tr '\\0' x; echo; echo last-line"
    result = await sandbox(layout).run(["bash", "-c", line], timeout=20, output_cap=1000)
    assert result.stdout_bytes == len("first-line\n") + 300000 + 1 + len("last-line\n")
    assert result.stdout.startswith("first-line\n")
    assert result.stdout.endswith("last-line\n")
    assert f"[... output truncated: {result.stdout_bytes} bytes in all; the middle is not shown ...]" in result.stdout
    assert len(result.stdout) < 1000 + 100


# -- the daemon's profile ------------------------------------------------------------------------


def test_profile_hides_other_roots_and_gives_secrets_only_to_their_goal(layout: dict[str, Path]) -> None:
    second = layout["state"].parent / "second-root"
    second.mkdir()
    profile = SandboxProfile(
        kind="bwrap",
        bwrap=Bwrap("bwrap"),  # building a sandbox runs nothing
        hidden=(layout["state"],),
        roots=(layout["root"], second),
        network=False,
        policies={"with-token": SandboxPolicy(network=True, secrets={"GIT_TOKEN": SECRET})},
    )
    plain = profile.sandbox(layout["mine"])
    assert (plain.network, dict(plain.secrets)) == (False, {})
    assert set(plain.hidden) == {layout["state"], layout["root"], second}
    keyed = profile.sandbox(layout["mine"], "with-token")
    assert (keyed.network, dict(keyed.secrets)) == (True, {"GIT_TOKEN": SECRET})
    assert profile.sandbox(layout["mine"], "another-goal").secrets == {}
    # A work directory that is itself a root (``goald run --workdir``) hides the other roots, not itself.
    assert set(profile.sandbox(second).hidden) == {layout["state"], layout["root"]}
    with pytest.raises(SandboxUnavailable, match="bwrap is missing"):
        SandboxProfile(unavailable="bwrap is missing").sandbox(layout["mine"])
    assert SandboxProfile(kind="none").sandbox(layout["mine"], "with-token").kind == "none"


@needs_bwrap
async def test_hidden_file_and_symlinked_paths(layout: dict[str, Path], outside: Path) -> None:
    secret_file = outside / "goals.toml"
    secret_file.write_text("api_key = 'x'\n")
    link = outside / "state-link"
    link.symlink_to(layout["state"])
    box = Sandbox(layout["mine"], hidden=(secret_file, link), bwrap=bwrap().path, disable_userns=bwrap().disable_userns)
    code, out, err = await sh(box, f"cat {secret_file} ; echo --- ; cat {layout['state'] / 'goald.db'} ; echo end")
    assert out.split() == ["---", "end"]
    assert "api_key" not in out and "database bytes" not in out
    assert "No such file" in err
    assert code == 0


# -- verification commands -----------------------------------------------------------------------


@needs_bwrap
async def test_verification_commands_run_in_the_sandbox_with_output_redacted(layout: dict[str, Path]) -> None:
    from goals import VerifyCommand, sandboxed_runner

    profile = SandboxProfile(
        kind="bwrap", bwrap=bwrap(), hidden=(layout["state"], layout["creds"]), roots=(layout["root"],), kill_grace=0.2
    )
    run = sandboxed_runner(profile.sandbox, Redactor([SECRET]))
    line = f"cat {layout['creds'] / 'openai-api-key'} ; ls .. ; echo {SECRET} >&2 ; exit 3"
    failed = await run(VerifyCommand(cmd=line), layout["mine"])
    assert (failed.exit_code, failed.timed_out, failed.passed) == (3, False, False)
    assert "No such file or directory" in failed.output_tail
    assert "mine\n[redacted]\n" in failed.output_tail and SECRET not in failed.output_tail
    slow = await run(VerifyCommand(cmd="sleep 600", timeout=0.3), layout["mine"])
    assert slow.timed_out and slow.exit_code is None
    assert slow.output_tail.endswith("[timed out after 0.3s; every process of the command was killed]")
    passed = await run(VerifyCommand(cmd="test -d . && touch verified"), layout["mine"])
    assert passed.passed and (layout["mine"] / "verified").exists()
    down = sandboxed_runner(SandboxProfile(unavailable="bwrap is missing").sandbox)
    refused = await down(VerifyCommand(cmd="true"), layout["mine"])
    assert not refused.passed and refused.output_tail == "verification cannot run: bwrap is missing"
