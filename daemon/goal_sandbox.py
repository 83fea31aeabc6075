"""One goal's sandbox: the config file's ``[goal_sandbox.<key>]`` merged with the goal's own ``sandbox``.

Everything that executes on a goal's behalf -- its shell calls, its verification commands, its
``progress`` command -- runs under the one policy :func:`goal_policy` makes, so a verification
gets exactly the network, secrets, extra read-only paths and limits the goal's shell gets.

How the two sources merge (both are the operator's: the config file, and a client of the control
socket, which is as privileged as the daemon's user). Each field is merged on its own, and a field
neither side sets keeps the daemon-wide default (``sandbox_network``, ``sandbox_max_processes`` ...):

* ``network``: the stricter of the two that are set (:meth:`~agent.sandbox.network.Network.merge`):
  ``"off"`` over an allow list over ``"host"``; two allow lists keep the names both allow. Neither
  set: the default.
* ``max_processes``, ``max_memory_mb``, ``max_disk_mb``: the smaller of the two caps that are set
  (``max_disk_mb``, what the work directory may hold on disk, is judged by the goal engine at each
  idle: :func:`goal_disk_limit`).
* ``read_only_paths``: the union.
* ``secrets``: the union by name; a name on both sides takes the config file's value. The spec names
  where the daemon reads each value (a credential file, an environment variable), never the value;
  it may not name a provider's API key (a goal's commands never get one), and a value that cannot
  be found is left unset, with an error in the log, as for the config file's secrets.
"""

from __future__ import annotations

from pathlib import Path

from loguru import logger

from agent import Redactor
from agent.limits import MIB
from agent.sandbox import Network, SandboxPolicy, SandboxProfile
from daemon.settings import Settings
from goals import Goal, SandboxSpec


def _lower(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def spec_secrets(spec: SandboxSpec) -> dict[str, str]:
    """The values of the secrets ``spec`` names (those that have one here)."""
    values: dict[str, str] = {}
    for name, source in spec.secrets.items():
        value = source.read()
        if value is None:
            logger.error("tool secret {} of a goal's sandbox has no value ({}); left unset", name, source.describe())
            continue
        values[name] = value
    return values


def goal_policy(profile: SandboxProfile, goal: Goal) -> SandboxPolicy:
    """The sandbox policy of ``goal``'s commands (see the module docstring for the merge)."""
    configured = profile.policies.get(goal.key) if goal.key is not None else None
    spec = goal.sandbox
    if spec.empty:
        return configured or SandboxPolicy()
    base = configured or SandboxPolicy()
    said = [n for n in (base.network, None if spec.network is None else Network.of(spec.network)) if n is not None]
    network = None if not said else said[0] if len(said) == 1 else said[0].merge(said[1])
    memory = spec.max_memory_mb * MIB if spec.max_memory_mb is not None else None
    return SandboxPolicy(
        network=network,
        secrets={**spec_secrets(spec), **base.secrets},
        read_only=tuple(dict.fromkeys((*base.read_only, *(Path(p) for p in spec.read_only_paths)))),
        max_processes=_lower(base.max_processes, spec.max_processes),
        max_memory_bytes=_lower(base.max_memory_bytes, memory),
    )


def goal_disk_limit(settings: Settings, goal: Goal) -> int | None:
    """What ``goal``'s work directory may hold on disk, in bytes (``None``: no limit): the smaller of
    its ``[goal_sandbox.<key>]`` and its own ``sandbox.max_disk_mb`` that are set, else
    ``sandbox_max_disk_mb``; 0 means no limit."""
    configured = settings.goal_sandbox.get(goal.key) if goal.key is not None else None
    mb = _lower(configured.max_disk_mb if configured is not None else None, goal.sandbox.max_disk_mb)
    if mb is None:
        mb = settings.sandbox_max_disk_mb
    return mb * MIB if mb else None


def goal_redactor(profile: SandboxProfile, spec: SandboxSpec) -> Redactor:
    """Every secret the daemon knows, and those of ``spec``."""
    own = spec_secrets(spec) if spec.secrets else {}
    return profile.redactor.union(Redactor(own.values())) if own else profile.redactor


def check_spec(settings: Settings, spec: SandboxSpec) -> None:
    """Refuse a spec whose secrets would hand a provider's API key to a goal's commands.

    Raises:
        ValueError: naming the secret.
    """
    keys = {source for provider in settings.providers.values() for source in provider.key_sources()}
    for name, source in spec.secrets.items():
        if source in keys:
            raise ValueError(f"sandbox.secrets.{name}: names a model provider's API key, which no goal's commands get")
