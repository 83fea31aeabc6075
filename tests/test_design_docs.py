"""Design documents named in the repository exist, and what ``docs/architecture.md`` names exists.

The design lives in the repository (``docs/architecture.md``). A module, test or document that sends
its reader to a design document that is not there -- the starting design the project began from,
which was never part of the repository, or a section that was renamed -- fails here, naming the
file and the line. Scanned: every ``.py`` and ``.md`` file of ``agent/``, ``goals/``, ``daemon/``,
``tests/``, ``benchmarks/``, ``systemd/`` and ``docs/``, and ``README.md``.

A reference is any of: the starting design's file name (upper case, ``.md``), a path under
``docs/`` ending in ``.md``, the architecture page's file name, a markdown link to a ``.md`` file
(or to a section of the same document), and a ``.md`` file named right after "see". A reference
resolves against the repository's root, the citing file's directory, or ``docs/``; a ``#fragment``
must be a heading of the document (GitHub's anchor for it). Names of ``.md`` files that are data (a
goal's ``report.md``) are none of these.

The architecture page also names tests (``tests/…py::test_name``), modules and folders: each must
exist, so the page cannot drift silently from the code it describes.

The self-tests feed the scanner small trees of their own, so the scan cannot pass by seeing nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED_DIRS = ("agent", "goals", "daemon", "tests", "benchmarks", "systemd", "docs")
SCANNED_FILES = ("README.md",)
ARCHITECTURE = "docs/architecture.md"

_PATH = r"[\w./-]*\w\.md"
REFERENCE = re.compile(
    r"(?P<ref>(?<![\w./-])(?:DESIGN\.md|(?:[\w.-]+/)*docs/" + _PATH + r"|architecture\.md))(?:#(?P<frag>[\w-]+))?"
    r"|\]\((?P<link>" + _PATH + r")?(?:#(?P<linkfrag>[\w-]+))?\)"
    r"|\b[Ss]ee\s+(?:the\s+)?[`'\"(]*(?P<see>" + _PATH + r")(?:#(?P<seefrag>[\w-]+))?"
)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
CITED_TEST = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
CITED_PATH = re.compile(
    r"`((?:agent|goals|daemon|tests|systemd|benchmarks|config|docs)/(?:[\w-]+/)*(?:[\w.-]+\.(?:py|md|toml|service))?)`"
)


@dataclass(frozen=True)
class Broken:
    """One reference that names a document or section that does not exist."""

    file: str
    line: int
    target: str
    why: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.target}: {self.why}"


def scanned_files(root: Path) -> list[Path]:
    """Every ``.py`` and ``.md`` file the scan reads (caches and virtualenvs left out)."""
    found = [root / name for name in SCANNED_FILES if (root / name).is_file()]
    for folder in SCANNED_DIRS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix in (".py", ".md") and path.is_file() and "__pycache__" not in path.parts:
                found.append(path)
    return found


def anchors(document: Path) -> set[str]:
    """The anchors GitHub gives the headings of a markdown document (repeats get ``-1``, ``-2`` …)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    in_code = False
    for line in document.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = None if in_code else HEADING.match(line)
        if match is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def resolve(root: Path, citing: Path, target: str) -> Path | None:
    """The document ``target`` names, from the root, the citing file's directory or ``docs/``."""
    for base in (root, citing.parent, root / "docs"):
        candidate = (base / target).resolve()
        if candidate.is_file() and candidate.is_relative_to(root):
            return candidate
    return None


def broken_references(root: Path, path: Path) -> list[Broken]:
    """Each reference in ``path`` to a design document or section that does not exist."""
    found: list[Broken] = []
    rel = path.relative_to(root).as_posix()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for match in REFERENCE.finditer(line):
            target = match.group("ref") or match.group("link") or match.group("see")
            fragment = match.group("frag") or match.group("linkfrag") or match.group("seefrag")
            if target is None:  # a link within a markdown document: ](#section)
                if fragment is None or path.suffix != ".md":
                    continue
                target = rel
            document = resolve(root, path, target)
            shown = target + (f"#{fragment}" if fragment else "")
            if document is None:
                found.append(Broken(rel, number, shown, "no such document in the repository"))
            elif fragment is not None and fragment not in anchors(document):
                found.append(Broken(rel, number, shown, "no such section in that document"))
    return found


def missing_citations(root: Path, document: Path) -> list[Broken]:
    """Each test (``path::name``), module or folder ``document`` names that does not exist."""
    found: list[Broken] = []
    rel = document.relative_to(root).as_posix()
    for number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), start=1):
        for test_file, name in CITED_TEST.findall(line):
            source = root / test_file
            if not source.is_file():
                found.append(Broken(rel, number, test_file, "no such test file"))
            elif not re.search(rf"^\s*(?:async\s+)?def {name}\(", source.read_text(encoding="utf-8"), re.MULTILINE):
                found.append(Broken(rel, number, f"{test_file}::{name}", "no such test"))
        for cited in CITED_PATH.findall(line):
            if not (root / cited.rstrip("/")).exists():
                found.append(Broken(rel, number, cited, "no such module or folder"))
    return found


def test_every_design_document_named_in_the_repository_exists() -> None:
    found = [b for path in scanned_files(ROOT) for b in broken_references(ROOT, path)]
    assert not found, "references to design documents that do not exist:\n" + "\n".join(map(str, found))


def test_what_the_architecture_page_names_exists() -> None:
    found = missing_citations(ROOT, ROOT / ARCHITECTURE)
    assert not found, f"{ARCHITECTURE} names what does not exist:\n" + "\n".join(map(str, found))


def test_the_scan_sees_the_repository_and_its_citations() -> None:
    files = {p.relative_to(ROOT).as_posix() for p in scanned_files(ROOT)}
    assert {"README.md", ARCHITECTURE, "agent/interval.py", "tests/test_design_docs.py"} <= files
    cited = [
        m
        for p in scanned_files(ROOT)
        for line in p.read_text(encoding="utf-8").splitlines()
        for m in REFERENCE.finditer(line)
    ]
    assert sum(1 for m in cited if m.group("ref") == ARCHITECTURE) >= 5
    assert len(CITED_TEST.findall((ROOT / ARCHITECTURE).read_text(encoding="utf-8"))) >= 50
    assert {"invariants", "the-store-contract", "the-sandbox", "decisions-and-why"} <= anchors(ROOT / ARCHITECTURE)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    return tmp_path


def test_the_scanner_flags_missing_documents_and_sections(tmp_path: Path) -> None:
    # Spelled in parts, so that this file names no missing document itself.
    starting, d, see, b_md = "DESIGN" + ".md", "docs", "see", "b.md"
    root = _tree(
        tmp_path,
        {
            f"{d}/a.md": (
                f"# A\n\n## Invariants\n\n## Invariants\n\n{see} [b]({b_md}#top), [i](#invariants-1), [g](#gone)\n"
            ),
            f"{d}/{b_md}": "# Top\n",
            "agent/m.py": (
                f'"""Invariant 4 ({starting}, invariant 4).\n\n'
                f"Also {d}/a.md#invariants, {d}/a.md#invariants-1 and {d}/a.md#nope.\n"
                f'{see.title()} `{d}/gone.md`; {see} other.md; architecture{b_md[1:]} is not there."""\n'
            ),
            "tests/t.py": 'DATA = ["report.md", "notes/today.md", "done.md"]  # data, not references\n',
        },
    )
    found = [b for path in scanned_files(root) for b in broken_references(root, path)]
    assert sorted((b.file, b.line, b.target) for b in found) == [
        ("agent/m.py", 1, starting),
        ("agent/m.py", 3, f"{d}/a.md#nope"),
        ("agent/m.py", 4, "architecture.md"),
        ("agent/m.py", 4, f"{d}/gone.md"),
        ("agent/m.py", 4, "other.md"),
        (f"{d}/a.md", 7, f"{d}/a.md#gone"),
    ]
    assert {b.why for b in found if b.target.endswith("#nope")} == {"no such section in that document"}


def test_the_scanner_checks_the_tests_and_paths_a_page_names(tmp_path: Path) -> None:
    d = "docs"
    root = _tree(
        tmp_path,
        {
            "tests/test_x.py": "async def test_real() -> None:\n    pass\n",
            "agent/store.py": "",
            f"{d}/p.md": (
                "`tests/test_x.py::test_real`, `tests/test_x.py::test_gone`, `tests/test_y.py::test_real`\n"
                "`agent/store.py`, `agent/`, `agent/gone.py`\n"
            ),
        },
    )
    found = missing_citations(root, root / d / "p.md")
    assert [(b.line, b.target, b.why) for b in found] == [
        (1, "tests/test_x.py::test_gone", "no such test"),
        (1, "tests/test_y.py", "no such test file"),
        (2, "agent/gone.py", "no such module or folder"),
    ]
