"""Checks of input when it is given, not when it first fails: the configuration (``goald config
check`` and ``goald serve``), the state directory, and each goal or schedule as it is added.

Why here and not at first use: a mistake that only shows when a model call goes out (requests
sent as ``Bearer no-key``), when a schedule fires at 3 a.m. (``--model nope:x``), or when a goal's
first claim is verified (a misspelt program, exit 127) costs a night. Each check says what is
wrong in one line and what to do.

Two strengths, on purpose:

* the configuration's findings (:func:`daemon.config_check.config_findings`) are *warnings*: the
  configuration is valid, but something in it will not work as the operator probably meant.
  ``goald serve`` logs them and starts; ``goald config check`` prints them and, with
  ``--strict``, fails (exit 78). This module holds what they share with the checks below: which
  model a configuration can build (:func:`model_problem`) and which has a price (:func:`unpriced`).
* :func:`check_goal_input` *refuses* a goal or schedule (JSON-RPC ``-32602`` naming the field,
  nothing written): its model must exist, its verification and progress commands' programs must
  be found where the sandbox will look for them, and a cost cap needs a priced model (otherwise
  the goal is exhausted at its first call).

:func:`state_dir_problem` is the one check that stops ``goald serve`` (exit 78, one line): a state
directory that cannot be written would otherwise end in a traceback and exit 1, which systemd
restarts for ever.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from agent import InvalidInput, ModelRegistry
from agent.sandbox.base import DEFAULT_PATH
from daemon.models import ProviderNeedsRestart
from daemon.rpc.protocol import InvalidField
from daemon.settings import ConfigError, Settings

if TYPE_CHECKING:
    from goals import Budgets

#: Models every daemon has, whatever the configuration says (:mod:`daemon.models`).
BUILTIN_MODELS = frozenset({"scripted:demo", "scripted:echo"})

#: Words a verification command may start with that are no program on any PATH.
_SHELL_WORDS = frozenset(
    {
        "!", ".", ":", "[", "[[", "alias", "break", "builtin", "case", "cd", "command", "continue", "declare",
        "echo", "eval", "exec", "exit", "export", "false", "for", "function", "if", "let", "local", "printf",
        "pwd", "read", "readonly", "return", "set", "shift", "source", "test", "time", "trap", "true", "type",
        "ulimit", "umask", "unset", "until", "wait", "while", "{", "(",
    }
)  # fmt: skip


class StateDirUnusable(ConfigError):
    """The state directory cannot be used (read-only, under a file, not a directory): exit 78."""


def model_problem(settings: Settings, spec: str) -> str | None:
    """Why ``spec`` names no model this configuration can build (``None``: it can)."""
    if spec in BUILTIN_MODELS:
        return None
    provider, _, name = spec.partition(":")
    if not name:
        return f"{spec!r} is not PROVIDER:MODEL"
    if provider not in settings.providers:
        known = ", ".join(sorted(settings.providers)) or "none"
        return (
            f"{spec!r}: no provider {provider!r} is configured (no [providers.{provider}] table; configured: {known})"
        )
    return None


def unpriced(settings: Settings, registry: ModelRegistry, spec: str) -> str | None:
    """Why a cost cap cannot work on ``spec`` (``None``: its price is known, or the model itself is
    unknown, which is reported on its own)."""
    provider, _, name = spec.partition(":")
    conf = settings.providers.get(provider)
    if conf is not None and conf.kind != "scripted":
        # Not built: building an HTTP model would import its provider's SDK.
        known = name in conf.prices
    else:
        try:
            known = registry.get(spec).price is not None
        except (InvalidInput, LookupError):
            return None
    if known:
        return None
    hint = f' (set [providers.{provider}.prices."{name}"])' if conf is not None else ""
    return f"model {spec!r} has no price{hint}: a cost cap would stop the goal at its first model call"


# -- the state directory ---------------------------------------------------------------------


def state_dir_problem(state_dir: Path) -> str | None:
    """Why goald cannot keep its state in ``state_dir`` (``None``: it can; it is made if missing).

    Writes (and removes) one probe file: a read-only mount passes every permission check but this.
    """
    path = state_dir.expanduser()
    for parent in [path, *path.parents]:
        if parent.exists() and not parent.is_dir():
            if parent == path:
                return f"state_dir {path} exists and is not a directory"
            return f"state_dir {path} cannot be made: {parent} is a file, not a directory"
        if parent.is_dir():
            break
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        return f"state_dir {path} cannot be made: {_why(exc)}"
    probe = path / f".goald-probe-{uuid.uuid4().hex}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        return f"state_dir {path} is not writable: {_why(exc)}"
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


def _why(exc: OSError) -> str:
    if exc.errno == errno.EROFS:
        return "read-only file system"
    return exc.strerror or str(exc)


def socket_gid(group: str) -> int:
    """The group id of ``socket_group`` (a name or a number).

    Raises:
        ConfigError: no such group on this machine.
    """
    import grp

    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(f"no group {group!r} on this machine (create it, or name another)") from None


# -- a goal or schedule as it is added -------------------------------------------------------


def one_call_warning(models: ModelRegistry, model: str, objective: str, budgets: Budgets) -> str | None:
    """A warning when the token budget cannot pay for a single call: each call reserves its
    prompt's upper bound plus its output limit, and the prompt holds the objective at least (the
    system prompt and tools add to it, so the figure is a lower bound). ``None`` when it can."""
    from agent.spend import estimator_for
    from agent.step import output_limit
    from goals.why import too_small_for_one_call

    budget = budgets.max_tokens_total
    if budget is None:
        return None
    m = models.get(model)
    reserves = output_limit(m.max_tokens, m.context_window) + estimator_for(m.spec).bound(len(objective.encode()))
    return too_small_for_one_call(budget, reserves, at_least=True) if reserves > budget else None


def check_goal_input(
    settings: Settings,
    registry: ModelRegistry,
    *,
    model: str,
    commands: Iterable[tuple[str, str]],
    max_cost: float | None,
    prefix: str = "",
) -> None:
    """Refuse a goal (or a schedule's goal) whose model, commands or cost cap cannot work.

    ``commands`` are ``(field, command line)`` pairs (``verify[0].cmd``, ``progress.cmd``);
    ``prefix`` is put before each field name (``goal.`` for a schedule).

    Raises:
        InvalidField: naming the field and what is wrong; nothing was written.
    """
    try:
        registry.get(model)
    except ProviderNeedsRestart as exc:
        raise InvalidField(f"{prefix}model: {exc}", field=f"{prefix}model") from None
    except (InvalidInput, LookupError) as exc:
        unknown = model_problem(settings, model) or str(exc)
        raise InvalidField(f"{prefix}model: {unknown}", field=f"{prefix}model") from None
    for field, cmd in commands:
        if (missing := program_problem(cmd)) is not None:
            raise InvalidField(f"{prefix}{field}: {missing}", field=f"{prefix}{field}")
    if max_cost is not None and (unpriced_why := unpriced(settings, registry, model)) is not None:
        raise InvalidField(f"{prefix}budgets.maxCost: {unpriced_why}", field=f"{prefix}budgets.maxCost")


def program_problem(cmd: str, path: str = DEFAULT_PATH) -> str | None:
    """Why the program ``cmd`` starts with cannot be run where the sandbox looks for it.

    Commands run with the sandbox's fixed ``PATH`` (``/usr/local/bin:/usr/bin:/bin`` and the
    ``sbin`` directories, all shown read-only in it) in the goal's work directory. A bare name is
    looked up on that PATH; an absolute path must exist; a relative path (``./check.sh``) is the
    work directory's business, where the agent may still write it, and is not checked. Shell
    words (``cd``, ``test``, ``if`` ...) and variable assignments before the program are skipped.
    """
    try:
        words = shlex.split(cmd, comments=True)
    except ValueError as exc:
        return f"not a valid command line: {exc}"
    for word in words:
        if "=" in word.split("/", 1)[0] and word.split("=", 1)[0].isidentifier():
            continue  # VAR=value before the program
        if word in _SHELL_WORDS or any(c in word for c in "$`*?;&|<>(){}"):
            return None  # a shell construct: the shell decides
        if word.startswith("/"):
            return None if os.access(word, os.X_OK) else f"program {word} does not exist or is not executable"
        if "/" in word:
            return None
        if shutil.which(word, path=path) is None:
            return f"program {word!r} is not on the sandbox's PATH ({path}): is it installed, or misspelt?"
        return None
    return None


__all__: list[str] = [
    "BUILTIN_MODELS",
    "StateDirUnusable",
    "check_goal_input",
    "model_problem",
    "program_problem",
    "socket_gid",
    "state_dir_problem",
    "unpriced",
]
