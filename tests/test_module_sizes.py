"""No module of goald is over 450 lines (``docs/architecture.md``, "Module sizes, and a goal's path
through the files"): a module that grows past it is split by concern, along a seam, before it lands."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "goals", "daemon")
LIMIT = 450


def test_no_module_is_over_450_lines() -> None:
    sizes = {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
    }
    assert len(sizes) > 200  # the scan sees the packages
    over = {name: n for name, n in sorted(sizes.items()) if n > LIMIT}
    assert not over, f"modules over {LIMIT} lines (split each by concern): {over}"
