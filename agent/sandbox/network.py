"""A sandbox's network, one of three settings, and what the allow list and the addresses mean.

* ``"off"`` (the default): the command has a network namespace of its own with only a loopback
  (``--unshare-net``): no host, no host's loopback, no host's abstract unix socket answers.
* ``{allow = ["api.github.com", "*.pypi.org"]}``: the same namespace of its own, and one way out:
  the daemon's proxy (:mod:`agent.sandbox.proxy`), reached through a bridge on
  ``127.0.0.1:3128`` inside the sandbox (:mod:`agent.sandbox.bridge`; ``HTTP_PROXY``,
  ``HTTPS_PROXY`` and ``ALL_PROXY`` point at it). The proxy lets a connection through only to a
  listed name, connects only to that name's public addresses (:func:`refused_address`: never
  loopback, link-local, private, multicast, unspecified or otherwise not global, so a listed name
  that resolves to ``127.0.0.1`` is refused), and records every attempt.
* ``"host"``: the host's own network namespace. **Unsafe**: the command reaches whatever the host
  reaches, its loopback (the model provider, the status page, a PostgreSQL store on
  ``127.0.0.1``) and its abstract unix sockets included.

``true`` and ``false``, the values of the older boolean setting, are still read: ``false`` is
``"off"``, ``true`` is ``"host"`` (what it always meant), deprecated (``goald config check``
says so).

Names in an allow list: a host name (``api.github.com``), matched exactly (case and a trailing
dot aside), or ``*.`` and a domain (``*.githubusercontent.com``), which matches every name *under*
the domain but not the domain itself; an IP address literal is matched as written (and its
address is still checked). No ports, schemes or paths: any port of a listed name is allowed.

Two settings merge (a goal's own ``sandbox`` with the config's ``[goal_sandbox.<key>]``) by
:meth:`Network.merge`: the stricter wins, ``off`` over an allow list over ``host``; two allow lists
keep the names both allow.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, field_validator

#: The settings, in the order of what they let through.
Mode = Literal["off", "allow", "host"]
_ORDER: dict[str, int] = {"off": 0, "allow": 1, "host": 2}
_LABEL = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
_NAME = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
#: Most names an allow list may hold.
MAX_NAMES = 256


def host_pattern(raw: str) -> str:
    """``raw`` as an allow-list entry: lowercase, without a trailing dot.

    Raises:
        ValueError: not a host name, ``*.`` and a domain, or an IP address.
    """
    name = raw.strip().lower().removesuffix(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    bare = name.removeprefix("*.")
    if len(name) > 253 or not _NAME.match(bare) or "*" in bare or (name != bare and "." not in bare):
        raise ValueError(
            f"{raw!r} is not a host name (api.github.com), '*.' and a domain (*.pypi.org) or an IP address"
        )
    return name


def host_matches(host: str, pattern: str) -> bool:
    """Whether the requested ``host`` (lowercased, no trailing dot) is one ``pattern`` allows."""
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and len(host) > len(pattern) - 1
    return host == pattern


def _covers(outer: str, inner: str) -> bool:
    """Whether every name ``inner`` allows is one ``outer`` allows."""
    if not inner.startswith("*."):
        return host_matches(inner, outer)
    return outer.startswith("*.") and (inner == outer or inner.endswith(outer[1:]))


@dataclass(frozen=True)
class Network:
    """One sandbox's network: :data:`Mode`, and the names an ``allow`` setting lets through."""

    mode: Mode = "off"
    allow: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in _ORDER:
            raise ValueError(f"network {self.mode!r}: expected off, allow or host")
        if self.mode != "allow" and self.allow:
            raise ValueError(f'network "{self.mode}" takes no allow list')
        object.__setattr__(self, "allow", tuple(dict.fromkeys(host_pattern(p) for p in self.allow)))

    @classmethod
    def of(cls, value: Network | NetworkAllow | bool | str | Mapping[str, Any] | None) -> Network:
        """A setting as configured: ``"off"``, ``"host"``, ``{allow = [...]}`` (or its model),
        ``true``/``false`` (``"host"``/``"off"``), or a :class:`Network`; ``None`` is ``"off"``.

        Raises:
            ValueError: anything else, naming the values.
        """
        if isinstance(value, Network):
            return value
        if value is None or value is False:
            return cls("off")
        if value is True:
            return cls("host")
        if isinstance(value, NetworkAllow):
            return cls("allow", tuple(value.allow))
        if isinstance(value, str) and value in ("off", "host"):
            return cls(value)  # type: ignore[arg-type]  # checked just above
        if isinstance(value, Mapping):
            return cls.of(NetworkAllow.model_validate(value))
        raise ValueError(_SHAPE)

    @property
    def host(self) -> bool:
        """Whether the command shares the host's network namespace (``"host"``)."""
        return self.mode == "host"

    @property
    def proxied(self) -> bool:
        """Whether the command reaches the daemon's proxy (``allow``)."""
        return self.mode == "allow"

    def allows(self, host: str) -> bool:
        """Whether the name ``host`` is one this setting's allow list lets through."""
        name = host.lower().removesuffix(".")
        if name.startswith("[") and name.endswith("]"):
            name = name[1:-1]
        return any(host_matches(name, pattern) for pattern in self.allow)

    def merge(self, other: Network) -> Network:
        """The stricter of the two: ``off`` over ``allow`` over ``host``; two allow lists keep what
        both allow (``*.github.com`` and ``api.github.com``: ``api.github.com``)."""
        if _ORDER[self.mode] != _ORDER[other.mode]:
            return self if _ORDER[self.mode] < _ORDER[other.mode] else other
        if self.mode != "allow":
            return self
        kept = [p for p in self.allow if any(_covers(q, p) for q in other.allow)]
        kept += [p for p in other.allow if any(_covers(q, p) for q in self.allow)]
        return Network("allow", tuple(kept))

    def describe(self) -> str:
        """In words, for logs and warnings."""
        if self.mode == "allow":
            return "allow " + (", ".join(self.allow) if self.allow else "(no name)")
        return self.mode

    def dump(self) -> str | dict[str, list[str]]:
        """As written in the configuration."""
        return {"allow": list(self.allow)} if self.mode == "allow" else self.mode


_SHAPE = (
    'expected "off", "host" (the host\'s network: unsafe) or {allow = ["api.github.com", "*.pypi.org"]}'
    ' (true and false, the older values, are read as "host" and "off")'
)


class NetworkAllow(BaseModel):
    """``{allow = [...]}``: the names the daemon's proxy lets a sandboxed command reach."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allow: list[str] = Field(max_length=MAX_NAMES)

    @field_validator("allow")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(host_pattern(p) for p in value))


def _shape(value: Any) -> Any:
    if isinstance(value, str) and value not in ("off", "host"):
        if value == "allow":
            raise ValueError('"allow" needs the names: network = {allow = ["api.github.com", ...]}')
        if value in ("on", "true", "yes"):
            raise ValueError(f'{value!r}: did you mean "host" (the host\'s network: unsafe)? {_SHAPE}')
        raise ValueError(f"{value!r}: {_SHAPE}")
    if not isinstance(value, str | bool | Mapping | NetworkAllow):
        raise ValueError(_SHAPE)
    return value


#: A network setting in the configuration or a goal's spec, kept as written (see the module docstring).
NetworkSetting = Annotated[Literal["off", "host"] | NetworkAllow | StrictBool, BeforeValidator(_shape)]


def deprecated(value: object) -> str | None:
    """What to say of a setting written as a boolean (``None``: it is not one)."""
    if value is True:
        return 'true is read as "host" (the host\'s network: unsafe); write network = "host" or an allow list'
    if value is False:
        return 'false is read as "off"; write network = "off"'
    return None


def refused_address(address: str) -> str | None:
    """Why the proxy may not connect to ``address`` (``None``: it is a public address).

    IPv4 addresses mapped into IPv6 (``::ffff:127.0.0.1``) are judged as the IPv4 address.
    """
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return f"{address!r} is not an IP address"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for what, hit in (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
    ):
        if hit:
            return f"{ip} is a {what} address"
    if not ip.is_global:
        return f"{ip} is not a public address"
    return None
