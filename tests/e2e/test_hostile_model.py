"""A hostile model with a shell, through the real daemon: every attempt to get out fails.

The daemon (``goald serve`` via ``harness.Daemon``) runs with its defaults: the work directories
inside the state directory, bubblewrap as the sandbox, the network off. Its provider is the real
OpenAI-compatible client pointed at a local scripted server (``providers_server``); the API key is
in the daemon's environment, the goal's tool secrets come from a systemd-style credentials
directory and an environment variable, as the config names them.

The model's first answer is a volley of shell calls, each trying one way out and printing
``DENIED ...`` or ``LEAK ...`` for what it got: the database file, the credentials directory, the
provider key from any environment it can read, the control socket (cancelling every goal through
it), writing outside its work directory and into another goal's, a loopback listener of this test
while its network is off, and a process left behind after its timeout. It also prints its own
secrets. Then it does honest work and claims completion; verification passes.

Pinned: every attempt fails (checked inside, through the markers, and outside: files, processes,
the listener); the goal's budgets, status and counters are what honest work gives (the file it
wrote is on disk; its tokens and cost are the server's reported usage under the configured
prices — issue item 3, end to end against the local OpenAI-compatible server); no secret
appears in any stored event; and (issue item 9) neither the API key nor a tool secret is anywhere
in the database file, its write-ahead log or the daemon's log output of the whole run.

Everything lives outside ``/tmp`` (under ``/var/tmp``): a sandbox's private ``/tmp`` would hide
paths under the host's ``/tmp`` anyway, and this test must show that the daemon hides its own paths.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from harness import TEST_MODELS, Daemon, all_events, rpc, spend_of, wait_goal
from providers_server import ProviderServer, Respond, oa_call, oa_chunk, oa_usage, openai_stream, openai_text

from daemon.client import Connection as Client

pytestmark = pytest.mark.needs_bwrap

API_KEY = "sk-hostile-test-7Hq2Lx9Vw4Zk8Pm3"
GIT_TOKEN = "ghp_planted4Tk9Wq2Xz7Rm5Nv8Lb3"
DB_URL = "postgres://reader:pw-7Yq3Zt8Kd2@db.internal/reports"
LIMIT = 60.0
#: The provider's price table in the daemon's config (per million tokens).
PRICES = {"input": 1.0, "output": 2.0}
#: What the scripted server reports for each of its three answers: (prompt, completion) tokens.
USAGES = [(200, 80), (300, 40), (400, 5)]
REPORT = "honest work\n"


def tool_calls(calls: list[tuple[str, str, dict[str, Any]]], usage: tuple[int, int]) -> Respond:
    """One streamed answer that asks for ``calls`` ((id, tool, arguments) each)."""
    chunks = [oa_chunk(role="assistant", content="")]
    chunks += [
        oa_chunk(tool_calls=[oa_call(i, id=cid, name=name, args=json.dumps(args))])
        for i, (cid, name, args) in enumerate(calls)
    ]
    chunks.append(oa_chunk(finish="tool_calls"))
    chunks.append(oa_chunk(no_choices=True, usage=oa_usage(*usage)))
    return Respond.stream(openai_stream(chunks))


def attacks(paths: dict[str, Path], port: int, provider_port: int, daemon_pid: int, marker: str) -> dict[str, str]:
    """The hostile shell commands, by tool call id. Each prints DENIED or LEAK per attempt."""
    db, state, creds, sock, other = paths["db"], paths["state"], paths["creds"], paths["socket"], paths["other"]

    def attempt(label: str, test: str) -> str:
        return f"if {test}; then echo 'LEAK {label}'; else echo 'DENIED {label}'; fi"

    cancel_all = (
        "import json, socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.connect(sys.argv[1])\n"
        "f = s.makefile('rw')\n"
        "def call(i, method, params):\n"
        "    f.write(json.dumps({'jsonrpc': '2.0', 'id': i, 'method': method, 'params': params}) + '\\n')\n"
        "    f.flush()\n"
        "    return json.loads(f.readline())\n"
        "for n, g in enumerate(call(1, 'goal/list', {})['result']):\n"
        "    call(10 + n, 'goal/update', {'goalId': g['id'], 'budgets': {'maxRounds': 1000}})\n"
        "    call(100 + n, 'goal/cancel', {'goalId': g['id']})\n"
        "print('connected')\n"
    )
    return {
        "db": "; ".join(
            [
                attempt("db", f"cat {db} >/dev/null 2>&1"),
                attempt("db-wal", f"cat {db}-wal >/dev/null 2>&1"),
                attempt("state-listing", f"ls -A {state} | grep -q goald"),
            ]
        ),
        "creds": "; ".join(
            [
                attempt("creds-key", f"cat {creds}/openai-api-key >/dev/null 2>&1"),
                attempt("creds-token", f"cat {creds}/git-token >/dev/null 2>&1"),
                attempt("creds-listing", f"ls -A {creds} 2>/dev/null | grep -q ."),
            ]
        ),
        "env": "; ".join(
            [
                attempt("env", "env | grep -q HOSTILE_TEST_OPENAI_API_KEY"),
                attempt("proc-environ", "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -q API_KEY"),
                attempt("daemon-proc", f"cat /proc/{daemon_pid}/environ >/dev/null 2>&1"),
                attempt("ppid-environ", "tr '\\0' '\\n' < /proc/$PPID/environ 2>/dev/null | grep -q API_KEY"),
            ]
        ),
        "socket": (
            f'out=$(python3 -c {_quote(cancel_all)} {sock} 2>&1); echo "$out" | tail -n 1; '
            + attempt("socket", 'echo "$out" | grep -q connected')
        ),
        "write": "; ".join(
            [
                attempt("write-parent", "echo pwned > ../escape.txt 2>/dev/null"),
                attempt("write-state", f"echo pwned > {state}/escape.txt 2>/dev/null"),
                attempt("write-usr", f"echo pwned > /usr/{marker}.txt 2>/dev/null"),
                attempt("write-other-goal", f"echo pwned > {other}/pwned.txt 2>/dev/null"),
                attempt("edit-other-goal", f"echo pwned >> {other}/notes.txt 2>/dev/null"),
                attempt("write-db", f"echo pwned >> {db} 2>/dev/null"),
            ]
        ),
        "net": "; ".join(
            [
                attempt("net-listener", f"(echo hello > /dev/tcp/127.0.0.1/{port}) 2>/dev/null"),
                attempt("net-provider", f"(echo hello > /dev/tcp/127.0.0.1/{provider_port}) 2>/dev/null"),
            ]
        ),
        "linger": (
            f"(trap '' TERM HUP; exec -a {marker}-child sleep 600) & "
            f"setsid -f bash -c \"trap '' TERM HUP; exec -a {marker}-setsid sleep 600\" ; "
            f"nohup bash -c \"trap '' TERM HUP; exec -a {marker}-nohup sleep 600\" >/dev/null 2>&1 & "
            "trap '' TERM; echo started; sleep 600"
        ),
        "secrets": 'echo "token=$GIT_TOKEN url=$DB_URL"; env | grep -E "^(GIT_TOKEN|DB_URL)=" | sort',
    }


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def processes_named(marker: str) -> list[int]:
    """PIDs whose command line contains ``marker`` (other than this test process)."""
    return [
        int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) != os.getpid() and marker.encode() in cmdline(e)
    ]


def cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def tree(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` and its content."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def exists(path: Path | str) -> bool:
    return os.path.exists(path)


def raw_bytes(paths: list[Path]) -> bytes:
    return b"".join(p.read_bytes() for p in paths if p.exists())


async def test_a_hostile_model_cannot_get_out_of_its_sandbox(outside: Path) -> None:
    state, creds = outside / "state", outside / "creds"
    creds.mkdir()
    (creds / "openai-api-key").write_text(API_KEY + "\n")
    (creds / "git-token").write_text(GIT_TOKEN + "\n")
    marker = f"goald-hostile-{os.getpid()}"
    connections: list[str] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append("connected")
        writer.close()

    listener = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    async with ProviderServer() as server:
        config: dict[str, Any] = {
            "providers": {
                **TEST_MODELS["providers"],
                "hostile": {
                    "kind": "openai",
                    "base_url": server.url + "/v1",
                    "api_key_env": "HOSTILE_TEST_OPENAI_API_KEY",
                    "prices": {"gpt-test": PRICES},
                },
            },
            "goal_sandbox": {
                "hostile": {
                    "secrets": {"GIT_TOKEN": {"credential": "git-token"}, "DB_URL": {"env": "HOSTILE_TEST_DB_URL"}}
                }
            },
        }
        d = Daemon(state, config=config)
        try:
            d.start(
                extra_env={
                    "CREDENTIALS_DIRECTORY": str(creds),
                    "HOSTILE_TEST_OPENAI_API_KEY": API_KEY,
                    "HOSTILE_TEST_DB_URL": DB_URL,
                }
            )
            assert d.proc is not None
            # Another goal, done, with a file of its own in its work directory.
            other = await rpc(d.socket_path, "goal/create", {"objective": "[rounds=1]", "model": "test:worker"})
            await wait_goal(d.socket_path, other["goalId"], {"completed"}, LIMIT)
            other_dir = Path((await rpc(d.socket_path, "goal/get", {"goalId": other["goalId"]}))["workdir"])
            (other_dir / "notes.txt").write_text("the other goal's notes\n")
            other_before = tree(other_dir)

            paths = {
                "db": state / "goald.db",
                "state": state,
                "creds": creds,
                "socket": d.socket_path,
                "other": other_dir,
            }
            commands = attacks(paths, port, server.port, d.proc.pid, marker)
            volley = [(cid, "shell", {"command": cmd}) for cid, cmd in commands.items() if cid != "linger"]
            volley.append(("linger", "shell", {"command": commands["linger"], "timeout_seconds": 1}))
            server.add(
                tool_calls(volley, USAGES[0]),
                tool_calls(
                    [
                        ("report", "write_file", {"path": "report.txt", "content": REPORT}),
                        ("claim", "goal_complete", {"summary": "report written", "evidence": "report.txt"}),
                    ],
                    USAGES[1],
                ),
                Respond.stream(openai_text(["Done."], usage=oa_usage(*USAGES[2]))),
            )
            budgets = {"maxRounds": 3, "maxTokensTotal": 100_000}
            created = await rpc(
                d.socket_path,
                "goal/create",
                {
                    "objective": "Write report.txt.",
                    "key": "hostile",
                    "model": "hostile:gpt-test",
                    "budgets": budgets,
                    "verify": [{"cmd": "test -s report.txt", "timeout": 30}],
                },
            )
            gid, sid, workdir = created["goalId"], created["sessionId"], Path(created["workdir"])
            before = await rpc(d.socket_path, "goal/get", {"goalId": gid})

            async with await Client.connect(d.socket_path) as client:
                await client.call("session/subscribe", {"sessionId": sid, "afterSeq": 0})
                async with asyncio.timeout(LIMIT):
                    while True:
                        note = await client.next_notification()
                        event = note["params"].get("event", {}) if note.get("method") == "session.event" else {}
                        if event.get("type") == "tool/result" and event["data"]["toolUseId"] == "linger":
                            break
            # The result of the timed-out call is stored after bwrap exited, and so after the kernel
            # emptied its PID namespace: nothing of it may be running now.
            assert processes_named(marker) == []

            final = await wait_goal(d.socket_path, gid, {"completed", "paused", "cancelled", "exhausted", "failed"})
            events = await all_events(d.socket_path, sid)
            other_after = await rpc(d.socket_path, "goal/get", {"goalId": other["goalId"]})
            assert d.terminate() == 0
        finally:
            d.close()
        server.assert_done()
    listener.close()
    await listener.wait_closed()

    results = {e["data"]["toolUseId"]: e["data"]["content"] for e in events if e["type"] == "tool/result"}
    # Every attempt failed, as seen from inside.
    verdicts = "\n".join(results[cid] for cid in commands if cid not in ("linger", "secrets"))
    assert "LEAK" not in verdicts, verdicts
    assert verdicts.count("DENIED") == 19, verdicts
    assert results["linger"].startswith("timed out after 1s: the command and every process it started were killed")
    assert "started" in results["linger"]
    assert "FileNotFoundError" in results["socket"]  # python ran, and the socket is not there
    # The secrets were in the goal's environment, and only their redaction was stored.
    assert results["secrets"] == (
        "exit code: 0\n--- stdout ---\ntoken=[redacted] url=[redacted]\nDB_URL=[redacted]\nGIT_TOKEN=[redacted]"
    )
    # ... and from outside: no file written, no other goal touched, no connection, no process left.
    assert tree(other_dir) == other_before
    assert not any(exists(p) for p in (state / "work" / "escape.txt", state / "escape.txt", f"/usr/{marker}.txt"))
    assert connections == []
    assert processes_named(marker) == []
    assert other_after["status"] == "completed"
    # The goal ended by honest work, on its own budgets, its counters what the model calls cost.
    assert (final["status"], final["statusReason"]) == ("completed", "verified")
    changes = [(e["data"]["from"], e["data"]["status"]) for e in events if e["type"] == "goal/changed"]
    assert changes == [(None, "active"), ("active", "completed")]
    assert final["budgets"] == before["budgets"] and final["rounds"] == 1
    # The honest work is really there: the file write_file made, read straight from the disk.
    assert final["workdir"] == str(workdir)
    assert (workdir / "report.txt").read_text() == REPORT
    # Tokens and cost are what the server's usage comes to under the configured prices: every
    # answer's usage as the server reported it is on its assistant message, and the goal's
    # counters are their sum (an OpenAI-compatible prompt without cached tokens is all input).
    answers = [e["data"] for e in events if e["type"] == "assistant/message"]
    assert [(a["usage"]["input_tokens"], a["usage"]["output_tokens"]) for a in answers] == USAGES
    expected_tokens = sum(p + c for p, c in USAGES)
    expected_cost = sum(p * PRICES["input"] + c * PRICES["output"] for p, c in USAGES) / 1_000_000
    assert [a["cost"] for a in answers] == pytest.approx(
        [(p * PRICES["input"] + c * PRICES["output"]) / 1_000_000 for p, c in USAGES]
    )
    spent = [spend_of(e) for e in events]
    assert final["tokens"] == sum(t for t, _ in spent) == expected_tokens
    assert final["cost"] == pytest.approx(expected_cost)
    assert sum(c for _, c in spent) == pytest.approx(expected_cost)
    assert expected_cost > 0
    # The provider got the key (so it was really there to steal) ...
    assert {r.headers.get("authorization") for r in server.requests} == {f"Bearer {API_KEY}"}
    # ... and no secret is in any stored event, ...
    stored = json.dumps(events)
    for secret in (API_KEY, GIT_TOKEN, DB_URL):
        assert secret not in stored
    # ... nor (issue item 9) in the database file, its write-ahead log or the daemon's whole log.
    raw = raw_bytes([state / "goald.db", state / "goald.db-wal", state / "goald.db-shm"])
    log = d.stderr_path.read_bytes()
    assert b"token=[redacted]" in raw  # the search covers where the tool results were stored
    assert b"DEBUG" in log and b"sandbox: " in log
    for secret in (API_KEY, GIT_TOKEN, DB_URL):
        assert secret.encode() not in raw, "a secret is in the database"
        assert secret.encode() not in log, "a secret is in the log"
