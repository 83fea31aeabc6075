"""The examples at the end of every command's help, kubectl's convention (``kubectl create job
--help``): an ``Examples:`` block of commands, each under a ``#`` line that says what it does.

They live here, by command path, apart from the parser (:mod:`daemon.cli.parser`), which calls
:func:`add_examples` once it is built; ``tests/daemon/test_cli_examples.py`` walks the whole tree
and fails for a command without examples, or an example the real parser does not accept.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

#: A command's examples: ``(what it does, the command line)``.
Example = tuple[str, str]

EXAMPLES: dict[str, list[Example]] = {
    "goald": [
        ("What each goal is doing now", "goald goal list"),
        ("The daemon's health", "goald status"),
    ],
    "goald serve": [
        ("Run the daemon with the configuration goald config check reads", "goald serve"),
        ("Run it with a given configuration file", "goald --config /etc/goald/goald.toml serve"),
    ],
    "goald status": [
        ("Version, PID, uptime, files, goals, providers and the next fire", "goald status"),
        ("The same as JSON", "goald status --json"),
    ],
    "goald reload": [
        ("Re-read the goals file and apply it by key (as SIGHUP and systemctl reload do)", "goald reload"),
        ("Say what was applied as JSON", "goald reload --json"),
    ],
    "goald goal": [
        (
            "Start a goal that is done when its check passes",
            "goald goal add 'Make the tests pass' --verify 'pytest -q'",
        ),
        ("Follow the goals as they change", "goald goal list --watch"),
    ],
    "goald goal add": [
        (
            "A goal done when its check passes, with a key and two budgets",
            "goald goal add 'Make the tests pass' --key tests --verify 'pytest -q' --max-rounds 20 --max-tokens 200000",
        ),
        (
            "A goal on another model with a cost cap and a deadline",
            "goald goal add 'Summarize the logs' --model openai:gpt-4o --max-cost 2 --deadline 2026-12-31T23:00:00Z",
        ),
    ],
    "goald goal list": [
        ("Every goal, newest first, with what it does now and its last error", "goald goal list"),
        ("The paused goals created in the last two hours", "goald goal list --status paused --since 2h"),
        ("Draw the table again whenever a goal changes (kubectl get -w)", "goald goal list --watch"),
        ("The newest 20 as JSON", "goald goal list --limit 20 --json"),
    ],
    "goald goal show": [
        ("Status and why, activity, budgets and the last events", "goald goal show tests"),
        ("Rounds, tokens and cost against the budgets, live", "goald goal show tests --watch"),
    ],
    "goald goal pause": [
        ("Pause a goal (a running turn finishes)", "goald goal pause tests"),
        ("Pause it saying why: shown as 'paused (by operator: ...)'", "goald goal pause tests --reason 'CI is down'"),
    ],
    "goald goal resume": [
        ("Resume a paused or exhausted goal", "goald goal resume tests"),
        ("Resume an exhausted goal with a larger token budget", "goald goal resume tests --max-tokens 500000"),
        ("Resume every goal paused for an authentication error", "goald goal resume --all --reason auth_error"),
    ],
    "goald goal cancel": [
        ("Cancel a goal (its running turn is interrupted)", "goald goal cancel tests"),
    ],
    "goald goal edit": [
        ("Raise a goal's round limit", "goald goal edit tests --max-rounds 40"),
        (
            "Change its objective (read from the next round)",
            "goald goal edit tests --objective 'Make the unit tests pass'",
        ),
    ],
    "goald goal logs": [
        ("Every event of the goal's session", "goald goal logs tests"),
        (
            "The latest 20 events of the last 10 minutes (journalctl -n, --since)",
            "goald goal logs tests -n 20 --since 10m",
        ),
        ("New events as they commit, until the goal ends", "goald goal logs tests --tail 5 --follow"),
    ],
    "goald goal export": [
        ("Write an ended goal with its sessions and events to a file", "goald goal export tests -o tests-goal.json"),
    ],
    "goald goal import": [
        ("Add a goal exported by another daemon", "goald goal import tests-goal.json"),
    ],
    "goald goal delete": [
        ("Delete an ended goal and its session (asks first)", "goald goal delete tests"),
        ("The same without asking, for scripts", "goald goal delete tests --yes"),
    ],
    "goald goal answer": [
        ("Answer a waiting goal's question with its second option", "goald goal answer report --option 2"),
        ("Answer it in words", "goald goal answer report 'use the postgres replica'"),
    ],
    "goald goal withdraw": [
        (
            "Withdraw a goal's question: it goes on without an answer",
            "goald goal withdraw report --reason 'not needed'",
        ),
    ],
    "goald goal questions": [
        ("Every question still waiting for an answer", "goald goal questions --open"),
        ("One goal's questions, answered or not, as JSON", "goald goal questions report --json"),
    ],
    "goald goal revoke": [
        ("Revoke a call approved for a goal", "goald goal revoke port 'shell: git push origin main'"),
        ("Revoke every approval of the goal", "goald goal revoke port --all"),
    ],
    "goald goal diff": [
        ("What a goal on a repository changed since its start", "goald goal diff port"),
        ("What its round 3 changed, a line per file", "goald goal diff port --round 3 --stat"),
    ],
    "goald goal commit": [
        ("Commit the goal's last recorded tree onto its branch", "goald goal commit port"),
    ],
    "goald goal replay": [
        (
            "The same goal from the same start on another model",
            "goald goal replay port --model local:qwen --key port-qwen",
        ),
    ],
    "goald eval": [
        ("Run a suite of tasks across models and print the table", "goald eval run suite.toml"),
    ],
    "goald eval run": [
        ("Start the runs not started yet, wait for all, and report", "goald eval run suite.toml"),
    ],
    "goald eval report": [
        ("The table of a suite's runs so far, written to a directory", "goald eval report suite.toml --out reports"),
    ],
    "goald send": [
        ("A follow-up to a goal's session", "goald send tests 'Use the March data'"),
        ("Steer the running turn at its next step", "goald send tests 'Commit what works first' --steer"),
        ("A message to a paused goal that resumes it too", "goald send tests 'The key is fixed now' --resume"),
    ],
    "goald schedule": [
        ("A goal every night at 03:00", "goald schedule add --cron '0 3 * * *' --key nightly 'Refresh the report'"),
        ("Every schedule with its next fire time", "goald schedule list"),
    ],
    "goald schedule add": [
        (
            "Every night at 03:00, Berlin time",
            "goald schedule add --cron '0 3 * * *' --timezone Europe/Berlin --key nightly 'Refresh the report'",
        ),
        (
            "Every hour, each goal with its own budgets",
            "goald schedule add --every 3600 --max-rounds 5 --max-cost 0.50 --max-wall 1800 'Triage new issues'",
        ),
    ],
    "goald schedule list": [
        ("Every schedule: next fire time (in its zone), suspended, last outcome", "goald schedule list"),
        ("The same as JSON", "goald schedule list --json"),
    ],
    "goald schedule rm": [
        ("Remove a schedule (its runs and goals stay)", "goald schedule rm nightly"),
    ],
    "goald schedule runs": [
        ("A schedule's runs and how the goal each started ended", "goald schedule runs nightly"),
        ("The latest 5 as JSON", "goald schedule runs nightly --limit 5 --json"),
    ],
    "goald schedule suspend": [
        ("Stop a schedule firing (each instant is recorded 'skipped (suspended)')", "goald schedule suspend nightly"),
    ],
    "goald schedule resume": [
        ("Let it fire again (misfire coalesce: once now for the latest skipped)", "goald schedule resume nightly"),
    ],
    "goald schedule run": [
        ("Fire now, by hand: one run marked manual (kubectl create job --from=cronjob)", "goald schedule run nightly"),
        ("The run as JSON", "goald schedule run nightly --json"),
    ],
    "goald store": [
        ("Database size, rows per table, the largest sessions", "goald store stats"),
        ("A consistent copy of the live database", "goald store backup /var/backups/goald-2026-12-04.db"),
    ],
    "goald store stats": [
        ("Sizes and the 5 largest sessions", "goald store stats --top 5"),
        ("The same as JSON", "goald store stats --json"),
    ],
    "goald store compact": [
        ("Run retention now and give free space back", "goald store compact"),
    ],
    "goald store vacuum": [
        ("A full VACUUM, with the daemon stopped (systemctl stop goald)", "goald store vacuum"),
    ],
    "goald store backup": [
        ("A consistent copy, taken online through the daemon", "goald store backup /var/backups/goald-2026-12-04.db"),
    ],
    "goald store restore": [
        (
            "With the daemon stopped (systemctl stop goald): restore, check it says ok, then start",
            "goald store restore /var/backups/goald-2026-12-04.db",
        ),
        (
            "Restore over an existing database (kept as <database>.before-restore)",
            "goald store restore /var/backups/goald-2026-12-04.db --replace",
        ),
    ],
    "goald node": [
        ("Every node of the cluster", "goald node list"),
    ],
    "goald node list": [
        ("Every node: alive or not, leases held, last heartbeat, labels", "goald node list"),
        ("The same as JSON", "goald node list --json"),
    ],
    "goald node drain": [
        ("Make a node hand its sessions back before maintenance", "goald node drain node-a"),
        ("Let it take work again", "goald node drain node-a --undo"),
    ],
    "goald notify": [
        ("Send a test message to every sink", "goald notify test"),
    ],
    "goald notify test": [
        ("Send a test message to every sink", "goald notify test"),
        ("To the sink named ops only", "goald notify test ops"),
    ],
    "goald config": [
        ("Validate the configuration and print the effective settings", "goald config check"),
    ],
    "goald config check": [
        ("Validate the configuration goald serve would read", "goald config check"),
        ("Fail on warnings too, for a given file", "goald config check --config /etc/goald/goald.toml --strict"),
    ],
    "goald demo": [
        ("Run the demo goal on the embedded defaults", "goald demo"),
        ("Plain lines, even on a terminal", "goald demo --plain"),
    ],
    "goald run": [
        ("One prompt in an embedded host, no daemon", "goald run 'List the files here' --model scripted:echo"),
        ("The prompt from stdin, the result as JSON", "goald run - --model scripted:echo --json"),
    ],
    "goald completion": [
        ("Completion in the current bash", "goald completion bash"),
        ("For fish (goald completion fish | source)", "goald completion fish"),
    ],
    "goald web": [
        ("Make a token for the status page", "goald web token add ops"),
    ],
    "goald web token": [
        ("The tokens' names", "goald web token list"),
    ],
    "goald web token add": [
        ("Make a token and print it once", "goald web token add ops"),
        ("A token that may look but not act", "goald web token add dashboard --read-only"),
    ],
    "goald web token list": [
        ("The tokens' names (never the tokens)", "goald web token list"),
    ],
    "goald web token remove": [
        ("Remove a token: its cookies stop working at once", "goald web token remove dashboard"),
    ],
    "goald acp": [
        ("Serve the Agent Client Protocol on stdio (an editor starts it)", "goald acp"),
        ("With the bridge's state kept apart", "goald acp --state-dir /var/lib/goald/acp-zed"),
    ],
}

HEADING = "Examples:"


def epilog(examples: list[Example]) -> str:
    """An ``Examples:`` block: each command under a ``#`` line saying what it does."""
    return "\n".join([HEADING, *(f"  # {what}\n  {line}" for what, line in examples)])


class ExamplesFormatter(argparse.HelpFormatter):
    """argparse's formatter, except the examples, which keep their lines as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith(HEADING):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def commands(parser: argparse.ArgumentParser, path: str = "goald") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command of the tree under ``parser``, by its path (``goald goal add``), itself first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, f"{path} {name}")


def add_examples(parser: argparse.ArgumentParser) -> None:
    """Give each command of the tree its examples (a command that has none keeps its help as it is)."""
    for path, command in commands(parser):
        if path in EXAMPLES:
            command.epilog = epilog(EXAMPLES[path])
            command.formatter_class = ExamplesFormatter


__all__ = ["EXAMPLES", "HEADING", "ExamplesFormatter", "add_examples", "commands", "epilog"]
