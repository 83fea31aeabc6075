"""Whether bubblewrap can make a sandbox on this machine, found once for the whole suite.

Tests that need it carry ``@pytest.mark.needs_bwrap`` (the root ``conftest.py`` skips them, with
the reason, where it cannot); tests that build a :class:`Sandbox` themselves use :data:`BWRAP`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
