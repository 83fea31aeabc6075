"""goald's daemon: the long-running process, its control protocol, CLI and integrations.

It owns the ``schedules`` and ``schedule_runs`` tables (:mod:`daemon.scheduler`) and reads goals and
sessions only through the ``goals`` and ``agent`` functions. Errors derive from
:class:`daemon.errors.DaemonError`.
"""

__version__ = "0.1.0"
