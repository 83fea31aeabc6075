"""Where the service may not make IPC namespaces (the system unit's ``RestrictNamespaces=~cgroup
ipc``), the sandbox still works: commands share the service's private IPC namespace instead.

The refusal is played by a wrapper in front of the real bubblewrap that fails, as bwrap does under
that seccomp filter, whenever it is asked for ``--unshare-ipc``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from sandboxkit import bwrap

from agent.sandbox import Sandbox, detect_bwrap

pytestmark = pytest.mark.needs_bwrap


def refusing_wrapper(tmp_path: Path) -> Path:
    wrapper = tmp_path / "bwrap-no-ipc"
    wrapper.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do [ "$a" = --unshare-ipc ] &&'
        ' { echo "bwrap: unshare: Operation not permitted" >&2; exit 1; }; done\n'
        f'exec {bwrap().path} "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def test_detection_falls_back_to_the_shared_ipc_namespace(tmp_path: Path) -> None:
    assert detect_bwrap(bwrap().path).unshare_ipc  # here, IPC namespaces can be made
    found = detect_bwrap(str(refusing_wrapper(tmp_path)))
    assert not found.unshare_ipc
    box = Sandbox(tmp_path, bwrap=found.path, disable_userns=found.disable_userns, unshare_ipc=found.unshare_ipc)
    assert "--unshare-ipc" not in box.argv(["true"])
    assert "--unshare-pid" in box.argv(["true"])  # everything else is unshared as before


async def test_a_command_runs_in_the_fallback_sandbox_and_stays_confined(
    tmp_path: Path, workdir: Path, sandboxed: Callable[..., Sandbox]
) -> None:
    found = detect_bwrap(str(refusing_wrapper(tmp_path)))
    work = workdir
    box = sandboxed(bwrap=found.path, unshare_ipc=found.unshare_ipc)
    assert not box.unshare_ipc
    proc = await asyncio.create_subprocess_exec(
        *box.argv(["sh", "-c", "echo made > out.txt; ls /root 2>&1; cat /proc/1/cmdline | tr '\\0' ' '"]),
        env=box.environment(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    text = out.decode()
    assert (work / "out.txt").read_text() == "made\n"
    assert "No such file" in text or "Permission denied" in text  # /root is not shown
    assert str(os.getpid()) not in text.split()  # its own PID namespace still
