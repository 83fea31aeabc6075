"""The configuration's findings: what in a valid configuration will probably not work as meant.

:func:`config_findings` returns *warnings*, not errors: the configuration is valid, but something in
it will not work as the operator probably meant (an unset key variable, a default model whose
provider has no table, a cost cap on a model without a price, a path that does not exist, a
directory the sandbox user cannot pass through). ``goald serve`` logs them and starts (except a
finding that :attr:`Finding.refuses_start`); ``goald config check`` prints them and, with
``--strict``, fails (exit 78) so that a deployment script can refuse them. The checks of the state
directory and of each goal or schedule as it is added are :mod:`daemon.checks`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent import InvalidInput, ModelRegistry
from agent.sandbox import SandboxUnavailable, sandbox_user
from agent.sandbox.identity import reach_problem
from agent.secret import SecretSource
from daemon.alerts.config import CommandSink, NtfySink, WebhookSink
from daemon.checks import model_problem, one_call_warning, socket_gid, unpriced
from daemon.sandbox_settings import network_findings
from daemon.settings import ConfigError, Settings

if TYPE_CHECKING:
    from daemon.declared import Declared


@dataclass(frozen=True)
class Finding:
    """One warning about the configuration: the key it concerns and what is wrong, in one line."""

    key: str
    message: str
    #: Advice for ``goald config check`` only (the default layout's shared file system, say): a
    #: daemon does not repeat it at every start.
    advice: bool = False
    #: ``goald serve`` refuses to start on it (exit 78), as ``config check --strict`` does: a
    #: notification sink whose secret has no value would fail every notification.
    refuses_start: bool = False

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


# -- the configuration -----------------------------------------------------------------------


def config_findings(
    settings: Settings, registry: ModelRegistry | None = None, declared: Declared | None = None
) -> list[Finding]:
    """What in a valid configuration will probably not work as meant (see the module docstring)."""
    out: list[Finding] = []
    out += _key_findings(settings)
    out += _network_findings(settings)
    for key in ("default_model", "summary_model"):
        spec = getattr(settings, key)
        if spec is not None and (why := model_problem(settings, spec)) is not None:
            out.append(Finding(key, why))
    out += _path_findings(settings)
    out += notify_findings(settings)
    if declared is not None and registry is not None:
        out += _declared_findings(settings, registry, declared)
    return out


def notify_findings(settings: Settings) -> list[Finding]:
    """Each secret of a notification sink (or the dead-man URL's) that has no value in this
    environment, by field: every notification to that sink would fail."""
    conf = settings.notify
    named: list[tuple[str, str, SecretSource | None]] = [
        ("notify.deadman_url_secret", "the dead-man URL", conf.deadman_url_secret)
    ]
    for i, sink in enumerate(conf.sinks):
        where = f"notify.sinks[{i}]"
        what = f"sink {sink.name!r}"
        if isinstance(sink, WebhookSink | NtfySink):
            named.append((f"{where}.url_secret", what, sink.url_secret))
        if isinstance(sink, WebhookSink):
            named.append((f"{where}.secret", what, sink.secret))
        if isinstance(sink, NtfySink):
            named.append((f"{where}.token", what, sink.token))
        if isinstance(sink, CommandSink):
            named += [(f"{where}.secrets.{name}", what, ref) for name, ref in sink.secrets.items()]
    return [
        Finding(key, f"{ref.describe()} has no value here: {what} could send no notification", refuses_start=True)
        for key, what, ref in named
        if ref is not None and not ref.read()
    ]


def _key_findings(settings: Settings) -> list[Finding]:
    out: list[Finding] = []
    for name, conf in settings.providers.items():
        if conf.kind == "scripted":
            continue
        where = f"providers.{name}"
        creds = os.environ.get("CREDENTIALS_DIRECTORY")
        has_credential = bool(conf.api_key_credential and creds and (Path(creds) / conf.api_key_credential).is_file())
        has_env = bool(conf.api_key_env and os.environ.get(conf.api_key_env))
        if has_credential or has_env or conf.api_key is not None:
            continue
        if conf.api_key_env:
            out.append(
                Finding(
                    f"{where}.api_key_env",
                    f"environment variable {conf.api_key_env} is not set (or empty) in this environment:"
                    " requests would go out without an API key",
                )
            )
        elif conf.api_key_credential:
            found = f"in {creds}" if creds else "($CREDENTIALS_DIRECTORY is not set: not run by systemd?)"
            out.append(
                Finding(
                    f"{where}.api_key_credential",
                    f"credential {conf.api_key_credential!r} not found {found}:"
                    " requests would go out without an API key",
                )
            )
        elif conf.base_url is None or not _is_local(conf.base_url):
            out.append(Finding(where, "names no API key (api_key_env, api_key_credential or api_key)"))
    return out


def _network_findings(settings: Settings) -> list[Finding]:
    """Each sandbox network that is the host's (what it exposes), and each written as a boolean."""
    out: list[Finding] = []
    for line in network_findings(settings):
        key, _, message = line.partition(": ")
        out.append(Finding(key, message))
    return out


def _is_local(url: str) -> bool:
    return any(host in url for host in ("://localhost", "://127.", "://[::1]"))


def _path_findings(settings: Settings) -> list[Finding]:
    out: list[Finding] = []
    for root in settings.workdir_roots:
        path = root.expanduser()
        if not path.exists():
            out.append(Finding("workdir_roots", f"{path} does not exist (goald serve would create it)"))
        elif not path.is_dir():
            out.append(Finding("workdir_roots", f"{path} is not a directory"))
    socket_dir = settings.socket_path.parent
    if not socket_dir.is_dir() and not socket_dir.is_relative_to(settings.state_dir.expanduser()):
        runtime = (
            " (systemd's RuntimeDirectory= makes it when the unit starts)"
            if str(socket_dir).startswith("/run/")
            else ""
        )
        out.append(Finding("socket", f"directory {socket_dir} does not exist{runtime}; goald serve would create it"))
    if settings.database is not None and not settings.database.expanduser().parent.is_dir():
        out.append(Finding("database", f"directory {settings.database.expanduser().parent} does not exist"))
    out += _shared_disk_findings(settings)
    out += _sandbox_reach_findings(settings)
    for index, path in enumerate(settings.sandbox_read_only_paths):
        if not path.exists():
            out.append(Finding(f"sandbox_read_only_paths[{index}]", f"{path} does not exist"))
    for group in [settings.socket_group] if settings.socket_group is not None else []:
        try:
            socket_gid(group)
        except ConfigError as exc:
            out.append(Finding("socket_group", str(exc)))
    return out


def _shared_disk_findings(settings: Settings) -> list[Finding]:
    """A work-directory root on the file system of the state directory (the default layout): a goal's
    command that fills it leaves the store no room (``[storage]`` softens that; only another file
    system prevents it). Checked when both exist."""
    out: list[Finding] = []
    state = settings.state_dir.expanduser()
    try:
        state_dev = state.stat().st_dev
    except OSError:
        return out
    for root in settings.roots:
        try:
            shared = root.stat().st_dev == state_dev
        except OSError:
            continue
        if shared:
            out.append(
                Finding(
                    "workdir_roots",
                    f"{root} is on the file system of the state directory {state}: a goal's command that"
                    " fills it leaves the store no room (the [storage] watermark and reserve soften this);"
                    " put workdir_roots on another file system",
                    advice=True,
                )
            )
    return out


def _sandbox_reach_findings(settings: Settings) -> list[Finding]:
    """A root daemon's commands run as the sandbox user, and bwrap, as that user, must pass through
    every directory above a work-directory root and a read-only path to bind them: one that does
    not let it through (or will not: a missing one ``goald serve`` makes under its umask 077) fails
    every command there with ``Can't find source path``. Said beforehand, naming the directory."""
    if os.geteuid() != 0 or settings.sandbox != "bwrap":
        return []
    try:
        user = sandbox_user(settings.sandbox_user, create=False)
    except SandboxUnavailable:
        user = None  # made at the first start: a new system user, passing by the others' bits only
    ids = user.ids if user is not None else (-1, -1)
    name = user.name if user is not None else settings.sandbox_user
    state = settings.state_dir.expanduser()
    places: list[tuple[str, Path, str]] = []
    for root in settings.roots:
        if root.is_relative_to(state) and root != state:  # serve lets the sandbox user through the state directory
            places.append(("state_dir", state, "the state directory, which holds the work directories"))
        else:
            places.append(("workdir_roots", root, "the work directories under it"))
    for path in settings.sandbox_read_only_paths:
        places.append(("sandbox_read_only_paths", path.expanduser(), "the read-only path"))
    out: list[Finding] = []
    for key, path, what in dict.fromkeys(places):
        problem = reach_problem(path, ids, name=name, what=what, setting=key)
        if problem is not None:
            out.append(Finding(key, problem))
            continue
        missing = next((p for p in reversed(path.parents) if not p.exists()), None)
        if key != "sandbox_read_only_paths" and missing is not None:
            out.append(
                Finding(
                    key,
                    f"{missing} does not exist: goald serve would make it 0700 (its umask), and the sandbox user"
                    f" {name!r} could not pass through it to {path}; make it yourself with mode 0711",
                )
            )
    return out


def _declared_findings(settings: Settings, registry: ModelRegistry, declared: Declared) -> list[Finding]:
    out: list[Finding] = []
    name = declared.path
    for goal in declared.goals:
        spec = goal.model or settings.default_model
        if goal.budgets.max_cost is not None and (why := unpriced(settings, registry, spec)) is not None:
            out.append(Finding(f"goals file {name}: goal {goal.key!r}: budgets.max_cost", why))
        if (short := _short_budget(registry, spec, goal.objective, goal.budgets)) is not None:
            out.append(Finding(f"goals file {name}: goal {goal.key!r}: budgets.max_tokens_total", short))
    for sched in declared.schedules:
        budgets = sched.goal.get("budgets") or {}
        cap = budgets.get("max_cost", budgets.get("maxCost")) if isinstance(budgets, Mapping) else None
        spec = sched.goal.get("model") or settings.default_model
        if cap is not None and (why := unpriced(settings, registry, spec)) is not None:
            out.append(Finding(f"goals file {name}: schedule {sched.key!r}: goal.budgets.max_cost", why))
        objective = str(sched.goal.get("objective", ""))
        if (short := _short_budget(registry, spec, objective, budgets)) is not None:
            out.append(Finding(f"goals file {name}: schedule {sched.key!r}: goal.budgets.max_tokens_total", short))
    return out


def _short_budget(registry: ModelRegistry, spec: str, objective: str, budgets: object) -> str | None:
    """:func:`one_call_warning` of a declared goal (its model and budgets checked or not)."""
    from goals import Budgets

    try:
        return one_call_warning(registry, spec, objective, Budgets.model_validate(budgets))
    except (InvalidInput, LookupError, ValueError):
        return None  # named by the goals file's own checks


__all__: list[str] = ["Finding", "config_findings", "notify_findings"]
