"""Every command's help ends with examples (kubectl's convention), and every example is a command
line the real parser accepts: the whole argparse tree of ``goald`` is walked, so a command added
without examples, or an example that a changed option breaks, fails here."""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex
import subprocess

import pytest
from harness import child_env, goald_argv

from daemon.cli.examples import EXAMPLES, HEADING, commands, epilog
from daemon.cli.parser import build_parser


def test_every_command_and_subcommand_has_examples_in_its_help() -> None:
    tree = dict(commands(build_parser()))
    assert len(tree) > 40  # the walk reaches the nested commands (goald web token add ...)
    missing = sorted(path for path in tree if path not in EXAMPLES)
    assert missing == [], f"commands without examples in daemon/cli/examples.py: {missing}"
    stale = sorted(path for path in EXAMPLES if path not in tree)
    assert stale == [], f"examples of commands that do not exist: {stale}"
    for path, command in tree.items():
        text = command.format_help()
        assert f"\n{HEADING}\n" in text, path
        examples = text.split(f"\n{HEADING}\n", 1)[1]
        for what, line in EXAMPLES[path]:
            assert f"  # {what}\n  {line}\n" in examples, (path, line)  # kept as written, not re-wrapped


@pytest.mark.parametrize(
    ("path", "line"), [(path, line) for path, examples in EXAMPLES.items() for _what, line in examples]
)
def test_each_example_parses_with_the_real_parser(path: str, line: str) -> None:
    words = shlex.split(line)
    assert words[0] == "goald", line
    # An example of a command runs that command (or, for a group, one of its own commands).
    command = path.split()[1:]
    assert any(words[i : i + len(command)] == command for i in range(1, len(words))) or not command, line
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = build_parser().parse_args(words[1:])
        except SystemExit as exc:
            pytest.fail(f"{line!r} does not parse (exit {exc.code}): {err.getvalue()}")
    assert isinstance(args, argparse.Namespace) and args.command is not None, line


def test_the_installed_command_prints_the_examples_with_its_help() -> None:
    for path in ("goald goal logs", "goald web token add", "goald"):
        done = subprocess.run(
            [*goald_argv(), *path.split()[1:], "--help"], env=child_env(), capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.rstrip().endswith(epilog(EXAMPLES[path]).rstrip()), (path, done.stdout)
