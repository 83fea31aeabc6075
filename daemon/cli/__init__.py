"""The ``goald`` command (``daemon.cli:entrypoint``; ``python -m daemon`` runs it too).

- :mod:`~daemon.cli.parser`: the arguments of every subcommand, the exit codes and ``--json``'s
  printing.
- :mod:`~daemon.cli.main`: ``main(argv) -> int``: the commands that run in this process (``serve``,
  ``run``, ``demo``, ``acp``, ``config check``, ``store vacuum``), and the call of the others.
- one module per command group that talks to a running daemon: :mod:`~daemon.cli.status`,
  :mod:`~daemon.cli.goal` (the reading commands in :mod:`~daemon.cli.goal_view`),
  :mod:`~daemon.cli.session` (``send``), :mod:`~daemon.cli.schedule`,
  :mod:`~daemon.cli.store`. How goals and events are shown is :mod:`daemon.display` (the demo,
  ``goald run`` and ACP show them too).
"""

from daemon.cli.main import entrypoint, main
from daemon.cli.parser import build_parser

__all__ = ["build_parser", "entrypoint", "main"]
