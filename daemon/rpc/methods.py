"""Every method of the control protocol, bound to one daemon (the canonical list is in the README).

One module per namespace (:mod:`~daemon.rpc.session`, :mod:`~daemon.rpc.goal`,
:mod:`~daemon.rpc.schedule`, :mod:`~daemon.rpc.daemon`), each registering its handlers on the
dispatcher with typed params and result. They see the daemon only as a
:class:`~daemon.rpc.context.HostPort`.
"""

from __future__ import annotations

from daemon.ports import HostPort
from daemon.rpc import branches, daemon, goal, node, schedule, session, store, timeline, transfer
from daemon.rpc.protocol import Dispatcher


def build_dispatcher(host: HostPort) -> Dispatcher:
    """Every method, bound to ``host``."""
    d = Dispatcher()
    daemon.register(d, host)
    session.register(d, host)
    goal.register(d, host)
    branches.register(d, host)
    timeline.register(d, host)
    schedule.register(d, host)
    store.register(d, host)
    transfer.register(d, host)
    node.register(d, host)
    return d
