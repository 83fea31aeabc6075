"""Fixtures of the goal engine's in-process tests (``tests/goals/``).

The runtime-with-engine and wait-for-status helpers live in ``tests/goalkit.py`` (helpers inside
test modules call them too); here they are offered as fixtures as well, with the frozen wall clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time
from freezegun.api import FrozenDateTimeFactory
from goalkit import goal_runtime as _goal_runtime
from goalkit import wait_status as _wait_status

from agent import Runtime, ScriptedModel
from goals import GoalEngine


@pytest.fixture
def goal_rig(db_path: Path) -> Callable[..., AbstractAsyncContextManager[tuple[Runtime, GoalEngine, ScriptedModel]]]:
    """``async with goal_rig(model_or_rule, ...) as (rt, engine, model)`` on the test's database."""
    return partial(_goal_runtime, db_path)


@pytest.fixture
def goal_status() -> Callable[..., Any]:
    """``await goal_status(rt, goal, GoalStatus.X)``: the goal's ``goal/changed`` data at that status."""
    return _wait_status


#: The instant :func:`frozen_clock` starts at (a fixed past instant, so runs are repeatable).
FROZEN_AT = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)


@pytest.fixture
def frozen_clock() -> Iterator[FrozenDateTimeFactory]:
    """Wall-clock time (``datetime.now``, ``time.time``) frozen at :data:`FROZEN_AT`.

    asyncio's own clock keeps running (``real_asyncio=True``), so timeouts, ``asyncio.sleep`` and a
    scripted model's ``delay=`` behave as usual. Move the frozen time with ``frozen_clock.move_to(...)``
    or ``frozen_clock.tick(seconds)``.
    """
    with freeze_time(FROZEN_AT, real_asyncio=True) as frozen:
        assert isinstance(frozen, FrozenDateTimeFactory)
        yield frozen
