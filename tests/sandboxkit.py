"""Whether bubblewrap can make a sandbox on this machine, found once for the whole suite.

Tests that need it carry ``@pytest.mark.needs_bwrap`` (the root ``conftest.py`` skips them, with
the reason, where it cannot); tests that build a :class:`Sandbox` themselves use :data:`BWRAP`.
Tests of the limits find here whether cgroups enforce them (:func:`needs_cgroups`) and which groups
of a daemon are left (:func:`our_groups`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from agent.sandbox import Bwrap, Sandbox, SandboxUnavailable, detect_bwrap

BWRAP: Bwrap | None
NO_BWRAP: str | None
try:
    BWRAP, NO_BWRAP = detect_bwrap(), None
except SandboxUnavailable as _exc:
    BWRAP, NO_BWRAP = None, str(_exc)


def bwrap() -> Bwrap:
    """The detected bubblewrap (only in a test marked ``needs_bwrap``)."""
    assert BWRAP is not None, NO_BWRAP
    return BWRAP


def sandbox_in(workdir: Path, **kw: Any) -> Sandbox:
    """A bubblewrap sandbox on ``workdir`` as the daemon would make it here, with a short kill grace
    (0.3 s) unless ``kw`` says otherwise."""
    found = bwrap()
    options: dict[str, Any] = {
        "bwrap": found.path,
        "disable_userns": found.disable_userns,
        "unshare_ipc": found.unshare_ipc,
        "kill_grace": 0.3,
        **kw,
    }
    return Sandbox(workdir, **options)


def needs_cgroups() -> None:
    """Skip, saying why, unless limits are enforced by cgroups here (a delegated v2 subtree, or v1's
    pids and memory writable): what the goal-wide caps need."""
    from agent.limits import Mechanism, limiter

    if limiter().mechanism is Mechanism.RLIMIT:
        pytest.skip("no writable cgroup here (neither delegated v2 nor v1 pids and memory)")


def cgroup_bases() -> list[Path]:
    """Where this process's limiter makes its groups (one directory per v1 hierarchy, one for v2)."""
    from agent.limits import limiter

    lim: Any = limiter()
    return list(getattr(lim, "bases", {}).values()) + ([lim.base] if hasattr(lim, "base") else [])


def our_groups(pid: int | None = None) -> list[str]:
    """The cgroups (goals' and commands') of the daemon ``pid`` (default: this process) still on the machine."""
    prefix = f"goald-{os.getpid() if pid is None else pid}-"
    return [e for base in cgroup_bases() for e in os.listdir(base) if e.startswith(prefix)]


def sandbox_python(*scripts: Path) -> tuple[str, dict[str, str], list[str]]:
    """How a test runs a Python program (``scripts``) in a sandbox a daemon makes: the interpreter,
    its environment and the paths to show read-only.

    A root daemon's sandboxed commands run as the sandbox user, who cannot reach an interpreter
    installed under ``/root`` (a pyenv, say): the system's ``/usr/bin/python3``, which every
    sandbox shows, runs the program instead, with this virtualenv's packages (the MCP SDK) on its
    path. Without a system Python of the same version, this interpreter and its prefixes are shown.
    """
    import site
    import sys

    system = "/usr/bin/python3"
    parents = sorted({str(p.parent) for p in scripts})
    if os.path.exists(system) and _version(system) == f"{sys.version_info[0]}.{sys.version_info[1]}":
        packages = site.getsitepackages()[0]
        return system, {"PYTHONPATH": packages}, sorted({packages, *parents})
    return sys.executable, {}, sorted({sys.base_prefix, sys.prefix, *parents})


def _version(python: str) -> str:
    import subprocess

    done = subprocess.run(
        [python, "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip()
