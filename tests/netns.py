"""Separate hosts on one machine: Linux network namespaces joined by veth pairs (iproute2).

`NetnsHosts` makes a star: a hub namespace (the daemon's host) with one link to the root
namespace (where the test and its HTTP client are) and one link to each leaf namespace (a
worker's host), each link its own /24. Names carry a random suffix so concurrent runs do not
collide; `close` deletes every namespace, which deletes the veth pairs in them too.

Without root or `ip netns`, tests skip, unless AGENTD_REQUIRE_NETNS=1 (CI), where that is a
failure: a green run must not hide an untested failover.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NoReturn

import pytest


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("AGENTD_REQUIRE_NETNS") == "1":
        pytest.fail(f"AGENTD_REQUIRE_NETNS=1 but {reason}")
    pytest.skip(reason)


def ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


@dataclass
class Link:
    """A veth pair: `near` in the hub (or root) namespace, `far` in the leaf."""

    near: str
    far: str
    near_ip: str
    far_ip: str


@dataclass
class NetnsHosts:
    leaves: tuple[str, ...]
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    net: int = field(default_factory=lambda: 16 + secrets.randbelow(200))
    namespaces: list[str] = field(default_factory=list)
    links: dict[str, Link] = field(default_factory=dict)

    @property
    def hub(self) -> str:
        return f"agd-{self.tag}-hub"

    def ns(self, leaf: str) -> str:
        return f"agd-{self.tag}-{leaf}"

    def open(self) -> NetnsHosts:
        self._add_ns(self.hub)
        self._link("root", None, self.hub, 0)
        for index, leaf in enumerate(self.leaves, start=1):
            self._add_ns(self.ns(leaf))
            self._link(leaf, self.hub, self.ns(leaf), index)
        return self

    def _add_ns(self, name: str) -> None:
        ip("netns", "add", name)
        self.namespaces.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def _link(self, name: str, near_ns: str | None, far_ns: str, subnet: int) -> None:
        # Interface names are at most 15 bytes.
        link = Link(f"ag{self.tag}{subnet}a", f"ag{self.tag}{subnet}b",
                    f"10.{self.net}.{subnet}.1", f"10.{self.net}.{subnet}.2")
        ip("link", "add", link.near, "type", "veth", "peer", "name", link.far)
        ip("link", "set", link.far, "netns", far_ns)
        if near_ns is not None:
            ip("link", "set", link.near, "netns", near_ns)
        near = ["-n", near_ns] if near_ns else []
        ip(*near, "addr", "add", f"{link.near_ip}/24", "dev", link.near)
        ip(*near, "link", "set", link.near, "up")
        ip("-n", far_ns, "addr", "add", f"{link.far_ip}/24", "dev", link.far)
        ip("-n", far_ns, "link", "set", link.far, "up")
        self.links[name] = link

    def set_link(self, leaf: str, up: bool) -> None:
        """Cut (or restore) a leaf's link, at the hub's end: the daemon's host loses it."""
        ip("-n", self.hub, "link", "set", self.links[leaf].near, "up" if up else "down")

    def close(self) -> None:
        root = self.links.get("root")
        if root is not None:
            with contextlib.suppress(RuntimeError):  # gone with the hub namespace already
                ip("link", "del", root.near)
        for name in reversed(self.namespaces):
            with contextlib.suppress(RuntimeError):
                ip("netns", "del", name)


def netns_hosts(*leaves: str) -> Iterator[NetnsHosts]:
    """For a fixture: a hub and `leaves`, deleted afterwards."""
    if shutil.which("ip") is None:
        _unavailable("iproute2's `ip` is not installed")
    if os.geteuid() != 0:
        _unavailable("network namespaces need root")
    hosts = NetnsHosts(leaves)
    try:
        hosts.open()
    except RuntimeError as exc:
        hosts.close()
        _unavailable(f"cannot make network namespaces: {exc}")
    try:
        yield hosts
    finally:
        hosts.close()
