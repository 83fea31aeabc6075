"""The ``goald`` command starts light: parsing a command that talks to a daemon loads the parser and
the JSON-RPC connection, not the runtime, the store, the sandbox or the web server.

Every CLI call pays its imports (the end-to-end tests make hundreds of calls), so this is pinned by
what a real interpreter has loaded, not by a timing: a child imports ``daemon.cli.main`` and
parses the arguments as ``main()`` does, then prints ``sorted(sys.modules)``. The packages'
``__init__`` modules (``agent``, ``goals``, ``daemon.client``, ``daemon.cluster``, ``daemon.alerts``)
re-export their names lazily (PEP 562), which is what keeps a narrow import narrow; the last test
checks that every name they export still resolves to the object in its home module.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys

import pytest
from harness import child_env

CHILD = """
import sys
import daemon.cli.main
from daemon.cli.parser import build_parser

build_parser().parse_args(sys.argv[1:])
print("\\n".join(sorted(sys.modules)))
"""

#: Modules a command that only talks to a daemon must not load: the settings' models (which pull
#: most of the tree), the runtime and its store, the goal engine, the sandbox, the web and metrics
#: servers, the database drivers and the SDK that runs a daemon in its process.
HEAVY = (
    "daemon.settings",
    "pydantic_settings",
    "daemon.host",
    "daemon.metrics",
    "daemon.client.sdk",
    "daemon.rpc.methods",
    "daemon.cluster.leases",
    "daemon.alerts.service",
    "agent.store",
    "agent.runtime",
    "agent.driver",
    "agent.payloads",
    "agent.sandbox",
    "agent.tools",
    "goals",
    "aiohttp",
    "aiosqlite",
    "sqlite3",
)

#: What such a command needs, loaded in every case (so that the check cannot pass by loading nothing).
NEEDED = ("daemon.cli.main", "daemon.cli.parser", "daemon.client.connection", "daemon.rpc.protocol", "argparse")


def loaded_after_parsing(*argv: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *argv], env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


@pytest.mark.parametrize(
    "argv",
    [
        ("goal", "list"),
        ("--socket", "/run/goald/goald.sock", "goal", "show", "nightly-report"),
        ("status",),
        ("send", "nightly-report", "Use the March data"),
        ("schedule", "list"),
    ],
    ids=" ".join,
)
def test_parsing_a_daemon_command_loads_only_the_parser_and_the_connection(argv: tuple[str, ...]) -> None:
    loaded = loaded_after_parsing(*argv)
    assert [name for name in NEEDED if name not in loaded] == []
    assert sorted(name for name in HEAVY if name in loaded) == []


def test_the_heavy_modules_named_exist() -> None:
    """A misspelt name would never be loaded, and the pin above would hold for nothing."""
    assert [name for name in HEAVY if importlib.util.find_spec(name) is None] == []


@pytest.mark.parametrize("package", ["agent", "goals", "daemon.client", "daemon.cluster", "daemon.alerts"])
def test_every_lazily_exported_name_resolves_to_its_home(package: str) -> None:
    module = importlib.import_module(package)
    homes: dict[str, str] = module._HOMES
    assert sorted(homes) == sorted(module.__all__)
    for name, home in homes.items():
        value = getattr(module, name)
        where = importlib.import_module(home)
        assert value is (where if home == f"{package}.{name}" else getattr(where, name)), name
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        _ = module.NoSuchName
