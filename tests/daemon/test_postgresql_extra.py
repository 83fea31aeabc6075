"""PostgreSQL is an extra: psycopg is imported only for a PostgreSQL store, and without it a
``postgresql://`` store is refused at ``config check`` and ``serve`` with the install command.

The missing module is simulated in a child process whose ``sitecustomize`` sets
``sys.modules["psycopg"] = None``, so ``import psycopg`` fails there as on an install without it.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from harness import ROOT, child_env, goald_argv

INSTALL = "pip install 'goald[postgresql]'"


def _without_psycopg(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text('import sys\nsys.modules["psycopg"] = None\n')
    env = child_env()
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    return env


def _config(tmp_path: Path, store: str | None) -> Path:
    path = tmp_path / "goald.toml"
    line = f'store = "{store}"\n' if store else ""
    path.write_text(f'{line}default_model = "test:echo"\nstate_dir = "{tmp_path / "state"}"\n')
    return path


def test_without_psycopg_a_postgresql_store_is_refused_naming_the_install_command(tmp_path: Path) -> None:
    env = _without_psycopg(tmp_path)
    config = _config(tmp_path, "postgresql://goald@localhost/goald")
    for command in (["config", "check"], ["serve"]):
        done = subprocess.run(
            [*goald_argv(), "--config", str(config), *command], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 78, (command, done.stdout, done.stderr)
        assert "key 'store'" in done.stderr and "needs psycopg, which is not installed" in done.stderr
        assert INSTALL in done.stderr
    assert not (tmp_path / "state").exists()  # refused before anything was written


def test_without_psycopg_a_sqlite_daemon_loads_and_checks_its_config(tmp_path: Path) -> None:
    env = _without_psycopg(tmp_path)
    config = _config(tmp_path, None)
    done = subprocess.run(
        [*goald_argv(), "--config", str(config), "config", "check"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    probe = "import daemon.host, daemon.ready_services, daemon.rpc.node, agent.store"
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_sqlite_daemon_never_imports_psycopg(tmp_path: Path) -> None:
    probe = (
        "import sys, daemon.host, daemon.ready_services, daemon.rpc.node, daemon.settings, agent.store;"
        " print('psycopg' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], env=child_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_psycopg_is_the_postgresql_extra_and_in_dev() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("psycopg") for dep in project["dependencies"])
    assert project["optional-dependencies"]["postgresql"] == ["psycopg[binary]>=3.2,<4"]
    assert "psycopg[binary]>=3.2,<4" in project["optional-dependencies"]["dev"]
