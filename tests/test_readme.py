"""The README opens with the two commands, and CI runs exactly the second."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_opens_with_two_commands_and_ci_runs_the_test_one() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)\n```", readme, re.S)
    assert len(blocks) >= 2
    demo, tests = blocks[0].strip(), blocks[1].strip()
    assert "goald demo" in demo
    assert "pytest" in tests
    # Nothing but the title comes before the first command.
    assert readme.index("```sh") < readme.index("\n", readme.index("# goald")) + 3
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests in ci.splitlines()
