"""The network settings where they are written: the config file (and its ``GOALD_*`` overrides),
a goal's spec over the control socket, the command line; and what ``goald serve`` and ``goald config
check`` say of them."""

from __future__ import annotations

from typing import Any

import pytest

from agent.sandbox import Network
from daemon.cli.goal import sandbox_params
from daemon.cli.parser import UsageError, build_parser
from daemon.rpc.params import GoalCreate
from daemon.sandbox_settings import network_findings
from daemon.settings import ConfigError, Settings, load_settings


@pytest.mark.parametrize(
    ("env", "network"),
    [
        ("host", Network("host")),
        ("off", Network("off")),
        ("false", Network("off")),
        ("true", Network("host")),
        ('{"allow": ["pypi.org"]}', Network("allow", ("pypi.org",))),
    ],
)
def test_the_environment_may_set_the_network(monkeypatch: pytest.MonkeyPatch, env: str, network: Network) -> None:
    monkeypatch.setenv("GOALD_SANDBOX_NETWORK", env)
    assert Network.of(load_settings(None).sandbox_network) == network


def test_a_wrong_network_in_the_file_stops_the_daemon_naming_the_values() -> None:
    with pytest.raises(ConfigError, match='"allow" needs the names'):
        load_settings(None, sandbox_network="allow")
    with pytest.raises(ConfigError, match="is not a host name"):
        load_settings(None, goal_sandbox={"g": {"network": {"allow": ["http://pypi.org"]}}})
    with pytest.raises(ConfigError, match="no wildcard"):
        load_settings(None, sandbox_network_hosts={"*.mirror.internal": ["10.0.0.5"]})
    with pytest.raises(ConfigError, match="IP"):
        load_settings(None, sandbox_network_hosts={"mirror.internal": ["not-an-address"]})
    hosts = load_settings(None, sandbox_network_hosts={"Mirror.Internal.": ["10.0.0.5"]}).sandbox_network_hosts
    assert {k: [str(a) for a in v] for k, v in hosts.items()} == {"mirror.internal": ["10.0.0.5"]}


def test_the_findings_name_what_host_exposes_and_the_old_booleans() -> None:
    settings = Settings(
        sandbox_network=True,
        goal_sandbox={"a": {"network": "host"}, "b": {"network": {"allow": ["pypi.org"]}}, "c": {"network": False}},
        mcp_servers={"npx": {"command": ["npx"], "network": True}},
    )
    found = network_findings(settings)
    assert [f.split(":")[0] for f in found] == [
        "sandbox_network",
        "sandbox_network",
        "goal_sandbox.a.network",
        "goal_sandbox.c.network",
        "mcp_servers.npx.network",
    ]
    assert "its abstract unix sockets" in found[0] and 'true is read as "host"' in found[1]
    assert 'false is read as "off"' in found[3]
    assert network_findings(Settings()) == []


@pytest.mark.parametrize(
    ("wire", "spec"),
    [
        ({"network": {"allow": ["PyPI.org"]}}, {"allow": ["pypi.org"]}),
        ({"network": "host"}, "host"),
        ({"network": False}, False),
    ],
)
def test_a_goals_own_network_on_the_wire(wire: dict[str, Any], spec: Any) -> None:
    network = GoalCreate.model_validate({"objective": "o", "sandbox": wire}).spec("m").sandbox.network
    assert (network.model_dump() if hasattr(network, "model_dump") else network) == spec


def test_a_goals_own_network_on_the_wire_is_refused_saying_why() -> None:
    with pytest.raises(ValueError, match='"allow" needs the names'):
        GoalCreate.model_validate({"objective": "o", "sandbox": {"network": "allow"}})


@pytest.mark.parametrize(
    ("argv", "sandbox"),
    [
        (["--network-allow", "pypi.org", "--network-allow", "*.github.com"],
         {"network": {"allow": ["pypi.org", "*.github.com"]}}),
        (["--network", "host"], {"network": "host"}),
        (["--network", "off"], {"network": "off"}),
        (["--no-network"], {"network": "off"}),
        ([], None),
    ],
)  # fmt: skip
def test_the_command_line_gives_the_three_settings(argv: list[str], sandbox: dict[str, Any] | None) -> None:
    args = build_parser().parse_args(["goal", "add", "objective", *argv])
    assert sandbox_params(args) == sandbox


def test_the_command_line_refuses_two_networks() -> None:
    args = build_parser().parse_args(["goal", "add", "o", "--network", "host", "--network-allow", "pypi.org"])
    with pytest.raises(UsageError, match="one or the other"):
        sandbox_params(args)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["goal", "add", "o", "--network", "on"])
