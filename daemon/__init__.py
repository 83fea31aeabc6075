"""goald's daemon: the long-running process, its control protocol, CLI and integrations.

Laid out by subsystem; the top level holds the process itself:

- :mod:`~daemon.host` (the lifecycle: start and stop order, run state), :mod:`~daemon.settings`,
  :mod:`~daemon.declared` (declared goals and schedules), :mod:`~daemon.models` (the provider
  registry) with :mod:`~daemon.demo_model` (``scripted:demo``), :mod:`~daemon.workdirs`,
  :mod:`~daemon.goal_sandbox`, :mod:`~daemon.notify` (systemd), :mod:`~daemon.logs`,
  :mod:`~daemon.lock`, :mod:`~daemon.errors`, :mod:`~daemon.ports` (:class:`HostPort`, the host
  as its parts see it), :mod:`~daemon.display` (goal and event lines, shared by the CLI, the demo,
  ``goald run`` and ACP), :mod:`~daemon.demo` and :mod:`~daemon.oneshot` (``goald run``).
- :mod:`daemon.rpc`: the control protocol, its transports and one module per method namespace.
- :mod:`daemon.schedule`: schedules (model, timing arithmetic, the service, firing a goal).
- :mod:`daemon.client`: the JSON-RPC :class:`~daemon.client.Connection` and the SDK's
  :class:`~daemon.client.Client` (public as :mod:`daemon.sdk`).
- :mod:`daemon.cli`: the ``goald`` command.
- :mod:`daemon.acp`: the Agent Client Protocol bridge for editors.

Dependencies point down: the host builds the RPC dispatcher, the scheduler and the declared goals,
which see it only as a :class:`~daemon.ports.HostPort` (or get the small service they use), so no
module imports the host back. It owns the ``schedules`` and ``schedule_runs`` tables
(:mod:`daemon.schedule.store`) and reads goals and sessions only through the ``goals`` and
``agent`` functions. Errors derive from :class:`daemon.errors.DaemonError`.
"""

__version__ = "0.1.0"
