"""Fixtures of the runtime's tests (``tests/agent/``): the store, driver, inbox, spend guard,
sandbox, tools and providers, in process. Cross-folder fixtures (the network guard, ``db_path``,
``open_runtime``, the ``needs_bwrap`` marker) are in ``tests/conftest.py``; the local provider
servers in ``tests/providers_server.py``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sandboxkit import NO_BWRAP, sandbox_in

from agent.sandbox import Sandbox


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A work directory of the test's own, private as the daemon makes them (0700)."""
    path = tmp_path / "work"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def sandboxed(workdir: Path) -> Callable[..., Sandbox]:
    """``sandboxed(**kw)``: a bubblewrap sandbox on :func:`workdir` as the daemon makes one here
    (skips where bubblewrap cannot make a sandbox)."""
    if NO_BWRAP is not None:
        pytest.skip(f"bubblewrap cannot make a sandbox here: {NO_BWRAP}")

    def make(**kw: Any) -> Sandbox:
        return sandbox_in(workdir, **kw)

    return make
