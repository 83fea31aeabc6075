"""The control protocol: JSON-RPC 2.0 over a unix socket (or stdio), one JSON object per line.

- :mod:`~daemon.rpc.protocol`: framing, error codes and the :class:`Dispatcher` (transport-free).
- :mod:`~daemon.rpc.server`: the transports, the unix socket server with its connection limits, and stdio.
- :mod:`~daemon.rpc.params`: every method's params (pydantic, camelCase on the wire).
- :mod:`~daemon.rpc.views`: how goals and events look on the wire.
- :mod:`~daemon.rpc.context`: :class:`HostPort`, the daemon as the methods see it.
- one module per namespace: :mod:`~daemon.rpc.session`, :mod:`~daemon.rpc.goal`,
  :mod:`~daemon.rpc.schedule`, :mod:`~daemon.rpc.daemon`; :mod:`~daemon.rpc.methods` binds them all.

This ``__init__`` imports nothing: its modules import each other by their full names, and
:mod:`daemon.schedule` (below the methods) imports the protocol's errors, so re-exporting the
methods here would make importing the protocol import the scheduler.
"""
