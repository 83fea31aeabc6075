"""Fixtures of the end-to-end tests (``tests/e2e/``): the real daemon as a process, its CLI, real
signals and ``kill -9``. Every test here carries the ``e2e`` marker (``pytest -m 'not e2e'`` runs the
in-process suites alone). The process harness itself is ``tests/harness.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import TEST_MODELS, Daemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A running daemon that knows the ``test:*`` models (``tests/goald_testmodels.py``)."""
    d = Daemon(tmp_path / "state", config=TEST_MODELS)
    d.start()
    yield d
    d.close()


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """``start_daemon(name="state", env=..., wait_ready=True, **config)``: a running daemon with the
    ``test:*`` models on ``tmp_path / name``, stopped after the test."""
    made: list[Daemon] = []

    def start(
        name: str = "state", *, env: dict[str, str] | None = None, wait_ready: bool = True, **config: Any
    ) -> Daemon:
        daemon = Daemon(tmp_path / name, config={**TEST_MODELS, **config})
        made.append(daemon)
        daemon.start(extra_env=env, wait_ready=wait_ready)
        return daemon

    yield start
    for daemon in made:
        daemon.close()
