"""The systemd units: systemd's own tools accept them, the system unit's exposure is 2.5 or lower,
and what they tell the daemon agrees with the daemon's settings.

``systemd-analyze verify`` runs on a copy of each unit whose ``ExecStart`` points at the goald
installed next to this interpreter, whose credentials come from files in the test's directory
and whose writable paths exist there. Where ``systemd-analyze`` is missing or older than 252 (the
first with ``security --offline=``) those tests are skipped, with the reason.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.cli import build_parser
from daemon.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_UNIT = ROOT / "systemd" / "goald.service"
USER_UNIT = ROOT / "systemd" / "goald-user.service"
#: One drop-in per provider key: the unit alone loads no credential (a local-only setup has none).
DROP_INS = sorted((ROOT / "systemd" / "goald.service.d").glob("*.conf"))
MIN_SYSTEMD = 252
MAX_EXPOSURE = 2.5

Entry = tuple[str, str, str]


def read_unit(path: Path) -> list[Entry]:
    """``(section, key, value)`` for every assignment, in order (keys may repeat)."""
    entries: list[Entry] = []
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not an assignment: {raw!r}"
        entries.append((section, key.strip(), value.strip()))
    return entries


def values(entries: list[Entry], key: str) -> list[str]:
    return [v for _s, k, v in entries if k == key]


def one(entries: list[Entry], key: str) -> str:
    found = values(entries, key)
    assert len(found) == 1, f"{key}= set {len(found)} times"
    return found[0]


def write_unit(path: Path, entries: list[Entry]) -> None:
    lines: list[str] = []
    section = None
    for sec, key, value in entries:
        if sec != section:
            lines.append(f"\n[{sec}]")
            section = sec
        lines.append(f"{key}={value}")
    path.write_text("\n".join(lines).lstrip() + "\n")


# -- systemd-analyze -------------------------------------------------------------------------


def systemd_analyze() -> str:
    """The ``systemd-analyze`` binary, or a skip saying why it cannot be used."""
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.skip("systemd-analyze is not installed (.ci/run installs it where the machine allows)")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    match = re.match(r"systemd (\d+)", out.stdout)
    if out.returncode != 0 or match is None:
        pytest.skip(f"cannot tell the systemd-analyze version: {out.stdout.strip() or out.stderr.strip()}")
    version = int(match.group(1))
    if version < MIN_SYSTEMD:
        pytest.skip(f"systemd-analyze {version} is older than {MIN_SYSTEMD}")
    return exe


def installed_goald() -> Path:
    """The goald console script of the installation these tests run from."""
    beside = Path(sys.executable).parent / "goald"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("goald")
    if found is None:
        pytest.skip("goald is not installed (pip install -e .) next to this interpreter or on PATH")
    return Path(found)


def unit_file_complaints(output: str, unit: Path) -> list[str]:
    """The lines where systemd complains about the unit file itself ("<path>:<line>: ...").

    ``verify`` exits 0 on an unknown key or a value it cannot parse and only says so; warnings
    about the machine (a missing target, say) name no line of our file and are not counted.
    """
    pattern = re.compile(rf"^{re.escape(str(unit))}:\d+:")
    return [line for line in output.splitlines() if pattern.match(line)]


def run_analyze(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=120, env={**os.environ, "SYSTEMD_LOG_COLOR": "0", **(env or {})}
    )


@pytest.fixture
def short_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory with a short path (the user manager puts sockets under $XDG_RUNTIME_DIR)."""
    if len(str(tmp_path)) <= 60:
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(prefix="gdu-") as short:
        yield Path(short)


def with_drop_ins() -> list[Entry]:
    """The system unit with every provider drop-in applied (their entries after the unit's)."""
    return read_unit(SYSTEM_UNIT) + [e for d in DROP_INS for e in read_unit(d)]


def system_unit_copy(tmp_path: Path, goald: Path, *, drop_ins: bool = True) -> Path:
    """The system unit (with the drop-ins, or alone) with ExecStart, credential sources and
    writable paths moved into tmp_path."""
    creds = tmp_path / "credentials"
    creds.mkdir()
    entries: list[Entry] = []
    for section, key, value in with_drop_ins() if drop_ins else read_unit(SYSTEM_UNIT):
        if key == "ExecStart":
            argv = shlex.split(value)
            value = shlex.join([str(goald), *argv[1:]])
        elif key == "LoadCredential":
            cred_id, _sep, _source = value.partition(":")
            source = creds / cred_id
            source.write_text("sk-test-not-a-key\n")
            value = f"{cred_id}:{source}"
        elif key == "ReadWritePaths":
            moved = []
            for i, path in enumerate(value.split()):
                target = tmp_path / f"rw{i}"
                target.mkdir()
                moved.append(("-" if path.startswith("-") else "") + str(target))
            value = " ".join(moved)
        entries.append((section, key, value))
    copy = tmp_path / SYSTEM_UNIT.name
    write_unit(copy, entries)
    return copy


@pytest.mark.parametrize("drop_ins", [True, False], ids=["with-credential-drop-ins", "local-only"])
def test_system_unit_verifies(tmp_path: Path, drop_ins: bool) -> None:
    exe = systemd_analyze()
    copy = system_unit_copy(tmp_path, installed_goald(), drop_ins=drop_ins)
    out = run_analyze([exe, "verify", "--man=no", "--no-pager", str(copy)])
    output = out.stdout + out.stderr
    assert out.returncode == 0, output
    assert unit_file_complaints(output, copy) == []


def test_the_unit_alone_loads_no_credential_and_each_drop_in_one() -> None:
    # A missing LoadCredential= source fails the unit with 243/CREDENTIALS: the unit names none, so a
    # local-only setup starts; each provider's drop-in adds its one line.
    assert values(read_unit(SYSTEM_UNIT), "LoadCredential") == []
    assert [d.stem for d in DROP_INS] == ["anthropic-api-key", "openai-api-key"]
    for d in DROP_INS:
        entries = read_unit(d)
        assert [(s, k) for s, k, _v in entries] == [("Service", "LoadCredential")]
        assert entries[0][2] == f"{d.stem}:/etc/goald/credentials/{d.stem}"


def test_system_unit_exposure_is_at_most_2_5(tmp_path: Path) -> None:
    exe = systemd_analyze()
    copy = system_unit_copy(tmp_path, installed_goald())
    out = run_analyze([exe, "security", "--offline=yes", "--no-pager", str(copy)])
    output = out.stdout + out.stderr
    assert out.returncode == 0, output
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", output)
    assert match is not None, output
    exposure = float(match.group(1))
    print(f"systemd-analyze security --offline=yes {SYSTEM_UNIT.name}: {exposure}")
    assert exposure <= MAX_EXPOSURE, output
    assert unit_file_complaints(output, copy) == []


def test_user_unit_verifies(tmp_path: Path, short_dir: Path) -> None:
    exe = systemd_analyze()
    goald = installed_goald()
    entries = []
    for section, key, value in read_unit(USER_UNIT):
        if key == "ExecStart":
            value = shlex.join([str(goald), *shlex.split(value)[1:]])
        entries.append((section, key, value))
    copy = tmp_path / "goald.service"
    write_unit(copy, entries)
    runtime = short_dir / "run"
    runtime.mkdir(mode=0o700)
    out = run_analyze([exe, "--user", "verify", "--man=no", "--no-pager", str(copy)], {"XDG_RUNTIME_DIR": str(runtime)})
    output = out.stdout + out.stderr
    if out.returncode != 0 and "Failed to initialize manager" in output and not unit_file_complaints(output, copy):
        pytest.skip(f"systemd-analyze --user cannot start a user manager here: {output.strip()}")
    assert out.returncode == 0, output
    assert unit_file_complaints(output, copy) == []


def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    # The check above would be empty if verify let a misspelt key or a bad value through unseen.
    exe = systemd_analyze()
    copy = system_unit_copy(tmp_path, installed_goald())
    text = copy.read_text().replace("Type=notify", "Type=notifyy").replace("UMask=", "UMsk=")
    copy.write_text(text)
    out = run_analyze([exe, "verify", "--man=no", "--no-pager", str(copy)])
    complaints = unit_file_complaints(out.stdout + out.stderr, copy)
    assert len(complaints) == 2, complaints


# -- what the units tell the daemon -----------------------------------------------------------


@pytest.mark.parametrize("unit", [SYSTEM_UNIT, USER_UNIT], ids=["system", "user"])
def test_unit_runs_goald_serve_as_a_notify_service(unit: Path) -> None:
    entries = read_unit(unit)
    assert one(entries, "Type") == "notify"
    assert one(entries, "NotifyAccess") == "main"
    assert one(entries, "Restart") == "on-failure"
    assert float(one(entries, "WatchdogSec")) > 0
    assert one(entries, "StateDirectory") == "goald"
    argv = shlex.split(one(entries, "ExecStart"))
    assert Path(argv[0]).name == "goald"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "serve"
    if unit == SYSTEM_UNIT:
        assert args.config == Path("/etc/goald/goald.toml")


def test_system_unit_stop_timeout_outlasts_the_shutdown_grace() -> None:
    entries = read_unit(SYSTEM_UNIT)
    grace = Settings.model_fields["shutdown_grace_seconds"].default
    assert float(one(entries, "TimeoutStopSec")) > grace
    assert one(entries, "KillMode") == "mixed"


@pytest.mark.parametrize("unit", [SYSTEM_UNIT, USER_UNIT], ids=["system", "user"])
def test_unit_environment_is_valid_daemon_settings(unit: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = dict(v.split("=", 1) for v in values(read_unit(unit), "Environment"))
    assert env["GOALD_LOG_FORMAT"] == "journal"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    assert settings.log_format == "journal"
    if unit == SYSTEM_UNIT:
        # The control socket lives in the runtime directory systemd creates and removes.
        runtime = one(read_unit(unit), "RuntimeDirectory")
        assert settings.socket_path.parent == Path("/run") / runtime


def test_system_unit_matches_the_example_config() -> None:
    entries = read_unit(SYSTEM_UNIT)
    example = (ROOT / "config" / "goald.example.toml").read_text()
    config = tomllib.loads(example)
    writable = {p.lstrip("-") for v in values(entries, "ReadWritePaths") for p in v.split()}
    # Every work-directory root the example config names is writable under ProtectSystem=strict.
    assert set(config["workdir_roots"]) <= writable
    assert config["state_dir"] == "/var/lib/" + one(entries, "StateDirectory")
    credentials = {v.split(":", 1)[0] for v in values(with_drop_ins(), "LoadCredential")}
    assert credentials == {"openai-api-key", "anthropic-api-key"}
    # The example's (commented) provider block names a credential the unit loads.
    named = set(re.findall(r'api_key_credential = "([^"]+)"', example))
    assert named and named <= credentials


# -- limits and what the sandbox may see -------------------------------------------------------


@pytest.mark.parametrize("unit", [SYSTEM_UNIT, USER_UNIT], ids=["system", "user"])
def test_unit_bounds_the_service_and_delegates_the_controllers_of_command_limits(unit: Path) -> None:
    entries = read_unit(unit)
    # The whole service (daemon and every command) has a ceiling the operator tunes.
    assert int(one(entries, "TasksMax")) >= 512
    assert re.fullmatch(r"\d+[KMGT]?", one(entries, "MemoryMax"))
    assert int(one(entries, "LimitNOFILE")) >= 4096
    # Each command's cgroup lives in the service's delegated subtree: pids and memory are delegated,
    # and the cgroup file system is not made read-only.
    assert {"pids", "memory"} <= set(one(entries, "Delegate").split())
    assert values(entries, "ProtectControlGroups") in ([], ["no"])
    # Commands need no cgroup namespace of their own; prlimit (the rlimit fallback) is not @resources.
    # The system unit also refuses IPC namespaces (commands share its private one, PrivateIPC=yes):
    # that keeps its exposure at 2.5 without PrivateUsers=, which would hide callers' uids.
    restricted = one(entries, "RestrictNamespaces").removeprefix("~").split()
    assert "cgroup" in restricted
    if unit == SYSTEM_UNIT:
        assert "ipc" in restricted
        assert one(entries, "PrivateIPC") == "yes"
        assert values(entries, "PrivateUsers") in ([], ["no"])


@pytest.mark.parametrize("unit", [SYSTEM_UNIT, USER_UNIT], ids=["system", "user"])
def test_the_units_config_and_environment_files_are_not_shown_to_sandboxed_commands(unit: Path) -> None:
    from agent.allowlist import ETC_SECRETS, SYSTEM_PATHS

    entries = read_unit(unit)
    argv = shlex.split(one(entries, "ExecStart"))
    files = [Path(argv[argv.index("--config") + 1])] if "--config" in argv else []
    files += [Path(v.lstrip("-").replace("%h", "/home/someone")) for v in values(entries, "EnvironmentFile")]
    files += [Path("/etc") / d for d in values(entries, "ConfigurationDirectory")]
    for v in values(with_drop_ins() if unit == SYSTEM_UNIT else entries, "LoadCredential"):
        files.append(Path(v.split(":", 1)[1].replace("%h", "/home/someone")))
    assert files
    for path in files:
        shown = any(path.is_relative_to(p) for p in SYSTEM_PATHS)
        covered = any(path.is_relative_to(s) for s in ETC_SECRETS if "*" not in s)
        assert not shown or covered, f"{unit.name}: {path} would be visible in the sandbox"


def test_the_system_units_address_allow_list_is_every_unicast_address_but_link_local() -> None:
    """The allow list is exactly the complement of what a provider can never be; the instance
    metadata address is outside it, public and private provider addresses inside."""
    entries = read_unit(SYSTEM_UNIT)
    assert one(entries, "IPAddressDeny") == "any"
    allowed = [ipaddress.ip_network(n) for line in values(entries, "IPAddressAllow") for n in line.split()]
    never = [ipaddress.ip_network(n) for n in ("0.0.0.0/8", "169.254.0.0/16", "224.0.0.0/3", "fe80::/10", "ff00::/8")]
    for version, everything in ((4, ipaddress.ip_network("0.0.0.0/0")), (6, ipaddress.ip_network("::/0"))):
        mine = [n for n in allowed if n.version == version]
        total = sum(n.num_addresses for n in mine) + sum(n.num_addresses for n in never if n.version == version)
        assert total == everything.num_addresses  # allowed and never-allowed cover it all
        assert list(ipaddress.collapse_addresses(mine)) == sorted(mine)  # with no overlap
    for address in ("169.254.169.254", "224.0.0.1", "fe80::1"):
        assert not any(ipaddress.ip_address(address) in n for n in allowed), address
    for address in (
        "104.18.6.192",
        "10.0.0.5",
        "127.0.0.1",
        "192.168.1.20",
        "2606:4700::6810:6c0",
        "::1",
        "fd00:ec2::1",
    ):
        assert any(ipaddress.ip_address(address) in n for n in allowed), address
