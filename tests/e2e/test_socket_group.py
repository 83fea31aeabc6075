"""The control socket shared with a group (``socket_group``): a member who is not root can list
and pause goals, someone outside the group is refused, and the pause event names the caller's uid
and pid as the kernel reported them (``SO_PEERCRED``).

The clients are real processes with unused uids and gids: the test forks, the child calls
``setgroups``/``setgid``/``setuid`` and runs the ``goald`` command's ``main``. pytest's temporary
directory is 0700, so the socket lives in a directory of its own that others may traverse.
"""

from __future__ import annotations

import asyncio
import grp
import json
import os
import pwd
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clusterkit import until
from harness import TEST_MODELS, Daemon, all_events, rpc

from daemon.cli import main

pytestmark = pytest.mark.e2e


def unused_id(taken: set[int], start: int) -> int:
    n = start
    while n in taken:
        n += 1
    return n


@pytest.fixture
def ids() -> tuple[int, int, int]:
    """(group, member uid, outsider uid): ids no account or group on this machine has."""
    if os.geteuid() != 0:
        pytest.skip("switching to other uids needs root")
    users = {p.pw_uid for p in pwd.getpwall()}
    groups = {g.gr_gid for g in grp.getgrall()}
    gid = unused_id(groups, 47_000)
    member = unused_id(users | {gid}, 47_100)
    outsider = unused_id(users | {member}, member + 1)
    return gid, member, outsider


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short directory others may traverse (0711): the socket's own mode decides who gets in."""
    path = Path(tempfile.mkdtemp(prefix="gsg-", dir="/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_user(uid: int, gid: int, groups: list[int], *args: str, sock: Path, home: Path) -> tuple[int, str, str]:
    """``goald --socket SOCK ARGS`` as ``uid:gid`` with supplementary ``groups``: ``(code, out, err)``.

    The test process forks and the child switches ids, then runs the CLI's ``main`` (the
    interpreter itself may live where other users cannot read, so nothing is executed anew; the
    modules the command needs are imported before the fork).
    """
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            os.close(out_r)
            os.close(err_r)
            sys.stdout = os.fdopen(out_w, "w")
            sys.stderr = os.fdopen(err_w, "w")
            os.environ.update({"HOME": str(home), "XDG_CONFIG_HOME": str(home)})
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            code = main(["--socket", str(sock), *args])
        except BaseException as exc:  # reported to the test through the pipe
            print(f"child failed: {exc!r}", file=sys.stderr)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(out_w)
    os.close(err_w)
    with os.fdopen(out_r) as out, os.fdopen(err_r) as err:
        stdout, stderr = out.read(), err.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), stdout, stderr


def test_a_group_member_lists_and_pauses_an_outsider_is_refused(
    tmp_path: Path, ids: tuple[int, int, int], socket_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gid, member, outsider = ids
    sock = socket_dir / "goald.sock"
    d = Daemon(tmp_path / "state", config={**TEST_MODELS, "socket": str(sock), "socket_group": str(gid)})
    try:
        d.start()
        st = sock.stat()
        assert (st.st_mode & 0o777, st.st_gid) == (0o660, gid)
        created = asyncio.run(
            rpc(
                sock,
                "goal/create",
                {
                    "objective": "Write notes [rounds=50 delay=0.2]",
                    "model": "test:worker",
                    "budgets": {"maxRounds": 60},
                },
            )
        )
        goal_id = created["goalId"]
        # What the children's commands import, imported here first (as root).
        assert main(["--socket", str(sock), "goal", "list", "--json"]) == 0
        assert main(["--socket", str(sock), "goal", "show", goal_id, "--json"]) == 0
        capsys.readouterr()

        # A member of the group, not root, in a process of its own.
        code, out, err = as_user(member, gid, [gid], "goal", "list", "--json", sock=sock, home=socket_dir)
        assert code == 0, err
        assert goal_id in out
        code, out, err = as_user(member, gid, [gid], "goal", "pause", goal_id, "--json", sock=sock, home=socket_dir)
        assert code == 0, err
        assert json.loads(out)["status"] == "paused"

        # Someone outside the group: refused by the kernel, with a plain answer.
        code, out, err = as_user(outsider, outsider, [], "goal", "list", sock=sock, home=socket_dir)
        assert code == 77, err  # EX_NOPERM: not 69, since a daemon is there
        assert err.startswith("goald: permission denied: not allowed to use the goald socket"), err
        assert "Traceback" not in err

        # The pause event names the member's uid (and a pid), as the kernel reported them.
        events = asyncio.run(all_events(sock, created["sessionId"]))
        changes = [e["data"] for e in events if e["type"] == "goal/changed" and e["data"]["status"] == "paused"]
        assert len(changes) == 1
        assert changes[0]["uid"] == member and isinstance(changes[0]["pid"], int) and changes[0]["pid"] > 0
        # The creation names its caller too (this test's process, as root).
        created_events = [e["data"] for e in events if e["type"] == "goal/changed" and e["data"]["status"] == "active"]
        assert created_events[0]["uid"] == os.getuid() and created_events[0]["pid"] == os.getpid()
        assert d.terminate() == 0
    finally:
        d.close()


async def test_edit_records_what_changed_and_who_asked(daemon: Daemon) -> None:
    d = daemon
    created = await d.acli_json("goal", "add", "Write notes [rounds=50 delay=0.2]", "--model", "test:worker")
    code, _out, err = await d.acli("goal", "edit", created["goalId"], "--title", "renamed", "--max-rounds", "40")
    assert code == 0, err
    events = await all_events(d.socket_path, created["sessionId"])
    edited = [e["data"] for e in events if e["type"] == "goal/edited"]
    assert len(edited) == 1
    changes = edited[0]["changes"]
    assert changes["title"]["after"] == "renamed" and changes["title"]["before"] != "renamed"
    assert changes["budgets"]["after"]["max_rounds"] == 40
    assert "objective" not in changes  # only what changed
    assert edited[0]["uid"] == os.geteuid() and edited[0]["pid"] > 0
    # A message sent through the socket names its sender too.
    code, _out, err = await d.acli("send", created["goalId"], "hello")
    assert code == 0, err
    events = await all_events(d.socket_path, created["sessionId"])
    sent = [
        e["data"]["source"] for e in events if e["type"] == "message/queued" and e["data"]["source"]["kind"] == "user"
    ]
    assert sent and sent[-1]["uid"] == os.geteuid() and sent[-1]["pid"] > 0


async def test_an_interrupt_and_a_cancelled_message_name_who_asked(daemon: Daemon) -> None:
    d = daemon
    me = {"uid": os.geteuid(), "pid": os.getpid()}  # rpc() calls from this process

    async def of_type(sid: str, kind: str) -> list[dict[str, Any]]:
        return [e["data"] for e in await all_events(d.socket_path, sid) if e["type"] == kind]

    # A session: a slow turn runs, a second message waits behind it.
    sid = (await rpc(d.socket_path, "session/new", {"model": "test:chat"}))["sessionId"]
    await rpc(d.socket_path, "session/prompt", {"sessionId": sid, "text": "take your time [delay=120]"})
    await until(lambda: of_type(sid, "turn/start"), "the slow turn running")
    queued = await rpc(d.socket_path, "session/prompt", {"sessionId": sid, "text": "and then this"})
    await rpc(d.socket_path, "session/cancelMessage", {"sessionId": sid, "messageId": queued["messageId"]})
    await rpc(d.socket_path, "session/interrupt", {"sessionId": sid})
    (gone,) = await of_type(sid, "message/cancelled")
    assert gone["messageId"] == queued["messageId"] and {k: gone.get(k) for k in me} == me
    (ended,) = await of_type(sid, "turn/end")
    assert ended["reason"] == "cancelled" and {k: ended.get(k) for k in me} == me

    # A goal cancelled with `goald goal cancel`: its running turn's end names the command's process.
    created = await d.acli_json("goal", "add", "Slow work [rounds=5 delay=120]", "--model", "test:worker")
    gsid = created["sessionId"]
    await until(lambda: of_type(gsid, "turn/start"), "the goal's first turn running")
    code, _out, err = await d.acli("goal", "cancel", created["goalId"])
    assert code == 0, err
    (ended,) = await until(lambda: of_type(gsid, "turn/end"), "the goal's turn ended")
    assert ended["reason"] == "cancelled" and ended["uid"] == os.geteuid()
    assert isinstance(ended["pid"], int) and ended["pid"] not in (0, os.getpid())  # the CLI's own process
    code, out, err = await d.acli("goal", "logs", created["goalId"])
    assert code == 0, err
    assert f"turn ended: cancelled after 0 step(s) (interrupted by request) by uid {os.geteuid()} (pid " in out, out
