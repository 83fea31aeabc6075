"""Fixtures of the daemon's in-process tests (``tests/daemon/``): settings, a host that was never
started, the dispatcher, the scheduler, the alert sender and the metrics, without a daemon process
(those tests are in ``tests/e2e/``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from daemon.host import Host
from daemon.settings import Settings, load_settings


@pytest.fixture
def settings_for(tmp_path: Path) -> Callable[..., Settings]:
    """``settings_for(**overrides)``: the daemon's settings with no config file, the state directory
    in the test's temp dir (``<tmp>/state``) and ``overrides`` applied as a config file would."""

    def make(**overrides: Any) -> Settings:
        return load_settings(None, **{"state_dir": tmp_path / "state", **overrides})

    return make


@pytest.fixture
def unstarted_host(settings_for: Callable[..., Settings]) -> Callable[..., Host]:
    """``unstarted_host(**overrides)``: a :class:`Host` on those settings that was never started (no
    store, no engine): for method tables and parameter checks."""
    return lambda **overrides: Host(settings_for(**overrides))
