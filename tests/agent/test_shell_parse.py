"""A ``shell:PATTERN`` rule cannot be talked around: a command line is parsed (bashlex) and allowed
only as plain simple commands of literal words; every other construct is denied, naming it.

* A table of bypasses, each denied under a policy whose only pattern is ``*`` (so the parse, not
  the pattern, refuses it) with a reason naming the construct, and of commands that stay allowed.
* Bash itself as the oracle: seeded random command lines; for each one the parser accepts, bash
  runs it with stub programs that log their arguments, and every program bash ran is one of the
  parsed commands, word for word.
* End to end (a real daemon, bubblewrap, a scripted model): with ``tools: ["shell:ls *"]`` the
  issue's ``${_@P}`` bypass is not run (the file it would write does not exist) and a
  ``tool/denied`` event records it; the same model with a bare ``shell`` does write the file.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from harness import Daemon, all_events, rpc, wait_goal
from shell_policy_testmodels import BYPASS, EXPANSIONS

from agent import ToolPolicy
from agent.tools.shellparse import Refusal, parse_commands, parse_simple

ROOT = Path(__file__).resolve().parents[2]
EXPECTED_BYPASS_REASON = "the command uses parameter expansion (${_@P}), which a shell pattern cannot check"

# -- the table -----------------------------------------------------------------------------------

ANYTHING = ToolPolicy(allow=["shell"], shell_allow=["*"])


@pytest.mark.parametrize(
    ("command", "construct"),
    [
        # The issue's bypass and the expansions a pattern cannot see through.
        (BYPASS, "parameter expansion (${_@P})"),
        ("ls $(id)", "command substitution ($(id))"),
        ("ls `id`", "command substitution (`id`)"),
        ('ls "x$(id)"', "command substitution ($(id))"),
        ("cat <(id)", "process substitution (<(id))"),
        ("ls >(id)", "process substitution (>(id))"),
        ("echo $((1))", "arithmetic expansion"),
        ("ls $[1+1]", "arithmetic expansion"),
        ("((x))", "an arithmetic command"),
        ("ls ${IFS}", "parameter expansion (${IFS})"),
        ("ls$IFS-la", "parameter expansion ($IFS)"),
        ('ls "$HOME"', "parameter expansion ($HOME)"),
        ("ls $@", "parameter expansion ($@)"),
        ("ls ${x:-$(id)}", "parameter expansion (${x:-$(id)})"),
        ("echo $'\\x41'", "ANSI-C quoting"),
        ("ls {a,b}", "brace expansion ({a,b})"),
        ("cat <<EOF\n$(id)\nEOF", "a here-document with expansion ($(id))"),
        # Builtins that run text as code, or assign by a name bash evaluates (a[$(id)] runs id).
        ("eval id", "'eval'"),
        ("'ev''al' id", "'eval'"),
        ("source x", "'source'"),
        (". x", "'.'"),
        ("exec id", "'exec'"),
        ("command id", "'command'"),
        ("builtin eval id", "'builtin'"),
        ("trap id EXIT", "'trap'"),
        ("declare 'a[$(id)]=1'", "'declare'"),
        ("read 'a[$(id)]' <<< x", "'read'"),
        ("printf -v 'a[$(id)]' x", "'printf -v'"),
        ("test -v 'a[$(id)]'", "'test -v'"),
        ("[ -v 'a[$(id)]' ]", "'[ -v'"),
        ("enable -f ./x.so x", "'enable'"),
        ("set -k", "'set'"),
        # Assignments, definitions, compound commands.
        ("BASH_ENV=x ls", "an assignment (BASH_ENV=x)"),
        ("PATH=. ls", "an assignment (PATH=.)"),
        ("IFS=/ ls", "an assignment (IFS=/)"),
        ("a[1]=2 ls", "an assignment (a[1]=2)"),
        ("x=1", "an assignment (x=1)"),
        ("f(){ id; }; f", "a function definition"),
        ("function f { id; }", "a function definition"),
        ("if true; then id; fi", "an if statement"),
        ("for i in a; do id; done", "a for loop"),
        ("while true; do id; done", "a while loop"),
        ("case x in x) id;; esac", "a case statement"),
        ("time id", "the time keyword"),
        ("coproc id", "a coprocess"),
        # Redirections out of the work directory, or through a second expansion.
        ("ls > /etc/x", "redirects to '/etc/x', outside the work directory"),
        ("ls > ../x", "redirects to '../x', outside the work directory"),
        ("ls 2> a/../../x", "redirects to 'a/../../x', outside the work directory"),
        ("ls >> ~/x", "an expanding redirection target (~/x)"),
        ("ls >&'$(id)'", "a >& redirection to a file"),
        ("ls {fd}>x", "a named descriptor ({fd})"),
        ("cd /tmp && ls > x", "changes directory and redirects to 'x'"),
        ("> x", "a redirection without a command"),
        # Command names that are not plain words; text that does not parse.
        ("l\\s -la", "a backslash in the command name (l\\s)"),
        ("l? -la", "a glob in the command name (l?)"),
        ("~/bin/x", "a ~ in the command name"),
        ("ls 'unclosed", "unbalanced quotes"),
        ("ls )(", "does not parse"),
        ("   ", "an empty shell command"),
        ("ls " + "a " * 3000, "more than the 4096 the shell policy parses"),
    ],
)
def test_a_construct_a_pattern_cannot_check_is_denied_naming_it(command: str, construct: str) -> None:
    reason = ANYTHING.check("shell", {"command": command})
    assert reason is not None and construct in reason, reason
    # The parse refuses it before any pattern is looked at: a narrow rule says the same.
    assert ToolPolicy.from_entries(["shell:ls *"]).check("shell", {"command": command}) == reason
    assert isinstance(parse_simple(command), Refusal)


def test_the_issues_bypass_is_denied_in_plain_words() -> None:
    policy = ToolPolicy.from_entries(["shell:ls *"])
    assert policy.check("shell", {"command": BYPASS}) == EXPECTED_BYPASS_REASON
    refusal = parse_commands(BYPASS)
    assert isinstance(refusal, Refusal) and refusal.construct == "parameter expansion"


@pytest.mark.parametrize(
    ("patterns", "command", "texts"),
    [
        (["ls *"], "ls -la", ["ls -la"]),
        (["git *"], "git status && git diff", ["git status", "git diff"]),
        (["ls *"], "ls 'a b'", ["ls a b"]),
        (["ls *"], "ls > out.txt", ["ls >out.txt"]),
        (["ls *", "grep *"], "ls 2>&1 | grep x", ["ls 2>&1", "grep x"]),
        (["ls *"], "'l''s' -la", ["ls -la"]),
        (["echo *"], 'echo "a\\"b" \\$x', ['echo a"b $x']),
        (["git *"], "(git status) || { git diff; } &", ["git status", "git diff"]),
        (["make *"], "make test 2>/dev/null >>log/out.txt", ["make test 2>/dev/null >>log/out.txt"]),
        (["cat *"], "cat <<EOF\nplain text\nEOF", ["cat <<EOF"]),
        (["ls *"], "ls *.py ~ # a comment $(id)", ["ls *.py ~"]),
        (["set *", "make *"], "set -euo pipefail; make test", ["set -euo pipefail", "make test"]),
        (["git *"], "git log @{u}", ["git log @{u}"]),
        (["find *"], "find . -name '*.py' -exec wc -l {} \\;", ["find . -name *.py -exec wc -l {} ;"]),
        (["[ *", "ls"], "[ -f x ] && ls", ["[ -f x ]", "ls"]),
    ],
)
def test_plain_simple_commands_are_matched_word_by_word(patterns: list[str], command: str, texts: list[str]) -> None:
    parsed = parse_commands(command)
    assert not isinstance(parsed, Refusal), parsed
    assert [c.text for c in parsed] == texts
    assert ToolPolicy(allow=["shell"], shell_allow=patterns).check("shell", {"command": command}) is None


def test_parse_simple_gives_the_words_of_each_command() -> None:
    assert parse_simple("ls -la && git  'di''ff' > out.txt") == [["ls", "-la"], ["git", "diff"]]
    refused = parse_simple("if true; then ls; fi")
    assert isinstance(refused, Refusal) and refused.construct == "an if statement"
    assert str(refused) == refused.reason


def test_bashlex_is_imported_only_when_a_command_is_checked() -> None:
    code = "import sys, agent.tools.policy; print('bashlex' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- bash as the oracle ------------------------------------------------------------------------------

#: Fragments of command lines: stub programs (a, b, c, o), quoting, every expansion, operators,
#: redirections, here-documents, comments and the odd characters between them.
FRAGMENTS = [
    *["a", "b", "c", "o", "-v", "=", "1", "-", "x=1", "'a'", '"b"', "a\\ b", "'a b'", "''", '""', "\\a", "a\\"],
    *["$x", "${x}", "$(a)", "`a`", "<(a)", ">(a)", "$((1))", "{a,b}", "'$(a)'", '"\\$(a)"', "\\$(a)", "~"],
    *["#", " #c", "a#b", "\\", "\\\\", "'", '"', "\\'", '\\"', "\\\n", "\r", "\t", " ", " ", " "],
    *[";", "&&", "||", "|", "|&", "&", "\n", "(", ")", "{", "}", "!", "{ a; }", "(a)", "c()", "a;b"],
    *[">", "<", ">>", "<>", ">|", "&>", ">&", "<&", "2>", "2>&1", ">&2", "<&-", ">o", "2>o", ">&o", "<<<"],
    *["<<E", "<<-E", "E", "E\n", "\nE\n"],
]
STUBS = ("a", "b", "c", "o", "E", "x")
END = "@END@"


def test_every_program_bash_runs_is_a_parsed_command(tmp_path: Path) -> None:
    bin_dir, work, log = tmp_path / "bin", tmp_path / "work", tmp_path / "log"
    bin_dir.mkdir()
    work.mkdir()
    for name in STUBS:
        stub = bin_dir / name
        stub.write_text(f'#!/bin/bash\nprintf "%s\\0" "${{0##*/}}" "$@" {END} >> "$LOG"\n')
        stub.chmod(0o755)
    rng = random.Random(24)
    accepted = 0
    for _ in range(5000):
        joiner = " " if rng.random() < 0.5 else ""
        command = joiner.join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 12)))
        parsed = parse_commands(command)
        if isinstance(parsed, Refusal):
            continue
        accepted += 1
        words = {c.words for c in parsed}
        log.write_bytes(b"")
        for leftover in work.iterdir():
            leftover.unlink()
        done = subprocess.run(
            ["/bin/bash", "-c", command],
            cwd=work,
            # HOME is "~": a tilde in an argument (allowed, as globs are: they expand inside the
            # sandbox, and are left out of the fragments) expands to itself.
            env={"PATH": str(bin_dir), "LOG": str(log), "x": "a", "HOME": "~"},
            capture_output=True,
            timeout=10,
        )
        ran: list[tuple[str, ...]] = []
        argv: list[str] = []
        for field in log.read_bytes().decode().split("\0")[:-1]:
            if field == END:
                ran.append(tuple(argv))
                argv = []
            else:
                argv.append(field)
        unexpected = [r for r in ran if r not in words]
        assert not unexpected, (command, sorted(words), ran, done.stderr)
    assert accepted >= 200, accepted  # the oracle saw enough lines the parser allows


# -- end to end: a real daemon, bubblewrap, the scripted model -------------------------------------------

CONFIG: dict[str, Any] = {"providers": {"sp": {"kind": "scripted", "script": "shell_policy_testmodels:models"}}}


@pytest.mark.needs_bwrap
async def test_the_bypass_is_not_run_by_a_goal_restricted_to_ls(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path / "state", config=CONFIG)
    try:
        daemon.start()
        base = {"objective": "List the directory.", "model": "sp:bypasser"}
        restricted = await rpc(daemon.socket_path, "goal/create", {**base, "tools": ["shell:ls *"]})
        # The control: the same commands under a bare shell (every command allowed).
        unrestricted = await rpc(daemon.socket_path, "goal/create", {**base, "tools": ["shell"]})
        ends = {"completed", "paused", "failed", "exhausted"}
        for created in (restricted, unrestricted):
            goal = await wait_goal(daemon.socket_path, created["goalId"], ends, 60)
            assert goal["status"] == "completed", goal
        events = await all_events(daemon.socket_path, restricted["sessionId"])
        control = await all_events(daemon.socket_path, unrestricted["sessionId"])
        assert daemon.terminate() == 0
    finally:
        daemon.close()

    # Restricted to `ls *`: the bypass did not run, the model was told why, and a durable event says so.
    assert not (Path(restricted["workdir"]) / "X").exists()
    results = {e["data"]["toolUseId"]: e["data"] for e in events if e["type"] == "tool/result"}
    assert results["tu_bypass"]["isError"]
    assert results["tu_bypass"]["content"] == "denied by policy: " + EXPECTED_BYPASS_REASON
    denied = {e["data"]["toolUseId"]: e["data"] for e in events if e["type"] == "tool/denied"}
    assert set(denied) == {"tu_bypass", *(e[0] for e in EXPANSIONS)}, denied
    assert (denied["tu_bypass"]["name"], denied["tu_bypass"]["reason"]) == ("shell", EXPECTED_BYPASS_REASON)
    # The six other expansions: none ran, each denied naming its construct.
    for call_id, _, written, construct in EXPANSIONS:
        assert not (Path(restricted["workdir"]) / written).exists(), call_id
        reason = denied[call_id]["reason"]
        assert reason.startswith(f"the command uses {construct} ("), (call_id, reason)
        assert results[call_id]["isError"] and results[call_id]["content"] == "denied by policy: " + reason
    # An allowed command still runs, in the sandbox.
    assert not results["tu_allowed"]["isError"], results["tu_allowed"]

    # The control shows the command is a real bypass: under a bare shell, bash ran `id`.
    assert not [e for e in control if e["type"] == "tool/denied"]
    assert "uid=" in (Path(unrestricted["workdir"]) / "X").read_text()
    for _, line, written, _ in EXPANSIONS:
        assert "uid=" in (Path(unrestricted["workdir"]) / written).read_text(), line
