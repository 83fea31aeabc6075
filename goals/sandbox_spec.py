"""A goal's own sandbox settings (``sandbox`` in a goal spec): network, extra read-only paths, caps
on its commands' processes, memory and disk, and its secrets by name.

How they merge with the configuration's ``[goal_sandbox.<key>]`` is the daemon's
(:mod:`daemon.goal_sandbox`); this is their shape and their input checks, part of the goal's one
declaration (:class:`goals.model.GoalSpec`).
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from agent.sandbox.network import NetworkSetting
from agent.secret import SecretSource

#: The goal's shape is also its wire shape: camelCase on the control protocol (``maxRounds``),
#: snake_case accepted as well (a config file, a stored row, a caller in process). ``model_dump()``
#: keeps the field names (the store's JSON columns); ``model_dump(by_alias=True)`` is the wire.
WIRE = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)


#: The smallest per-goal caps accepted (bwrap itself is two processes and a few MiB).
MIN_PROCESSES = 8
MIN_MEMORY_MB = 16
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Variables the sandbox sets itself; a secret may not replace them.
_SANDBOX_VARIABLES = frozenset({"PATH", "HOME", "LANG", "TMPDIR"})


def _env_named(source: SecretSource) -> SecretSource:
    """A goal's secret read from the environment names a valid variable (the config's are not checked)."""
    if source.env is not None and not _ENV_NAME.match(source.env):
        raise ValueError(f"{source.env!r} is not a valid environment variable name")
    return source


#: Where the daemon reads one secret of a goal's sandbox: never the value itself.
GoalSecret = Annotated[SecretSource, AfterValidator(_env_named)]


class SandboxSpec(BaseModel):
    """A goal's own sandbox settings (``sandbox`` in a goal spec), beside the config file's
    ``[goal_sandbox.<key>]``. How the two merge is the daemon's (see the README's goal section):
    the stricter network wins (``"off"`` over an allow list over ``"host"``; two allow lists keep
    the names both allow), the smaller of two caps wins, read-only paths and secrets are the union
    (the config's value of a secret named on both sides)."""

    model_config = WIRE

    #: The network of this goal's commands: ``"off"``, ``{"allow": [names]}`` (through the daemon's
    #: proxy) or ``"host"`` (unsafe); ``true``/``false`` are read as ``"host"``/``"off"``
    #: (``None``: the daemon's default).
    network: NetworkSetting | None = None
    #: Extra paths the goal's commands may read (a toolchain under ``/opt``, say): absolute.
    read_only_paths: list[str] = Field(default=[], max_length=64)
    #: Processes of the goal's commands all together, at once (bwrap's two of each included).
    max_processes: int | None = Field(default=None, ge=MIN_PROCESSES, le=1_000_000)
    #: Memory of the goal's commands all together, in MiB.
    max_memory_mb: int | None = Field(default=None, ge=MIN_MEMORY_MB, le=16 * 1024 * 1024)
    #: What the goal's work directory may hold on disk, in MiB (measured at each idle: over it, the
    #: goal pauses ``disk_limit``).
    max_disk_mb: int | None = Field(default=None, ge=1, le=1024 * 1024 * 1024)
    #: Secret environment variables of this goal's commands, by name: where the daemon reads each.
    secrets: dict[str, GoalSecret] = Field(default={}, max_length=64)

    @field_validator("read_only_paths")
    @classmethod
    def _paths(cls, value: list[str]) -> list[str]:
        out: list[str] = []
        for raw in value:
            if not raw.startswith("/"):
                raise ValueError(f"read-only path {raw!r} must be absolute")
            if "\0" in raw or any(part == ".." for part in raw.split("/")):
                raise ValueError(f"read-only path {raw!r} must not contain '..' or NUL")
            path = posixpath.normpath(raw)
            if path == "/":
                raise ValueError("read-only path '/' would show the whole host: name the directories needed")
            if path not in out:
                out.append(path)
        return out

    @field_validator("secrets")
    @classmethod
    def _names(cls, value: dict[str, SecretSource]) -> dict[str, SecretSource]:
        for name in value:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
            if name in _SANDBOX_VARIABLES:
                raise ValueError(f"{name} is set by the sandbox itself")
        return value

    @property
    def empty(self) -> bool:
        """Whether it says nothing (the config entry, if any, and the defaults apply)."""
        return self == SandboxSpec()


__all__ = ["MIN_MEMORY_MB", "MIN_PROCESSES", "WIRE", "GoalSecret", "SandboxSpec"]
