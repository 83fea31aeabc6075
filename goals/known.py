"""The live goals this process wrote last, by session: what a goal tool records on, without a read.

A goal tool (``goal_progress``, ``goal_complete``, ``goal_blocked``) records an event naming its
session's live goal and answers with the goal's blocked streak and whether it is paused. Every
goal row this process writes (:func:`goals.store.save_goal`, :func:`goals.store.insert_goal`) is
remembered here once its transaction commits, and forgotten when the goal is no longer live; the
tool records on the remembered goal and checks, in the same write, that the row is still at that
revision (:meth:`agent.tx.Tx.expect_one`, no round trip of its own). A goal another node or process
changed since fails that check: nothing is written, the goal is forgotten and read again. So a
goal tool's record is one round trip where it was two (issue 30), and what it records is exactly
what it was: the live goal as it is when the record commits.

Bounded: at most :data:`LIMIT` goals per store, the least recently written forgotten first (a
goal that moved to another node and ended there is never written here again); a goal forgotten
only costs its next record one read.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

from agent import Store, Tx
from goals.model import Goal

#: The most goals one store's process remembers.
LIMIT = 10_000

_lock = threading.Lock()  # the store's threads remember, the event loop's tools look up
_known: weakref.WeakKeyDictionary[Store, OrderedDict[str, Goal]] = weakref.WeakKeyDictionary()


def _of(store: Store) -> OrderedDict[str, Goal]:
    known = _known.get(store)
    if known is None:
        known = _known[store] = OrderedDict()
    return known


def remember(tx: Tx, goal: Goal) -> None:
    """Remember ``goal`` as its session's once ``tx`` commits (forget it there if it is not live)."""
    store = tx.store

    def committed() -> None:
        with _lock:
            known = _of(store)
            if goal.status.live:
                known[goal.session_id] = goal
                known.move_to_end(goal.session_id)
                while len(known) > LIMIT:
                    known.popitem(last=False)
            elif (was := known.get(goal.session_id)) is not None and was.id == goal.id:
                del known[goal.session_id]

    tx.on_commit(committed)


def known_goal(store: Store, session_id: str) -> Goal | None:
    """The live goal of ``session_id`` as this process last wrote it (``None``: none known)."""
    with _lock:
        return _of(store).get(session_id)


def forget(store: Store, session_id: str) -> None:
    """Forget the goal known for ``session_id`` (it changed elsewhere: read it again)."""
    with _lock:
        _of(store).pop(session_id, None)


def still_at(tx: Tx, goal: Goal, error: type[Exception]) -> None:
    """Check, in ``tx``, that ``goal``'s row is still at its revision and holds its session."""
    tx.expect_one(
        "SELECT 1 FROM goals WHERE id=? AND revision=? AND session_id=?",
        (goal.id, goal.revision, goal.session_id),
        error=lambda: error(f"goal {goal.id} changed since this process wrote it"),
    )
