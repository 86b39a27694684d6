"""Network namespaces joined by a bridge: separate "hosts" on one machine.

Each namespace gets its own address on a private /24 behind a Linux bridge in
the root namespace; the root namespace (where the Spark master, the driver and
the Ray head run) owns the bridge's address. Needs CAP_NET_ADMIN and ``ip``.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Self

__all__ = ["HostNetwork", "netns_unavailable_reason"]

log = logging.getLogger(__name__)


def _ip(*args: str, netns: str | None = None) -> None:
    argv = ["ip", *(("netns", "exec", netns, "ip") if netns else ()), *args]
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise OSError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.returncode}")


def netns_unavailable_reason() -> str | None:
    """None when this machine lets us make network namespaces, else why not."""
    if shutil.which("ip") is None:
        return "the 'ip' command (iproute2) is not installed"
    probe = f"rdprobe{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", probe)
    except OSError as exc:
        return f"cannot create a network namespace here (needs CAP_NET_ADMIN): {exc}"
    try:
        _ip("netns", "del", probe)
    except OSError:
        pass
    return None


@dataclass
class HostNetwork:
    """``hosts`` namespaces on 10.<b>.<c>.0/24; the root side is ``.1``."""

    hosts: int
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    subnet: str = ""
    names: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    _made: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        b, c = 64 + int(self.tag[:2], base=16) % 64, int(self.tag[2:], base=16)
        self.subnet = f"10.{b}.{c}"
        self.bridge = f"rdbr{self.tag}"

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge (driver, master, Ray head)."""
        return f"{self.subnet}.1"

    def create(self) -> HostNetwork:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made.append(("link", self.bridge))
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(self.hosts):
                name, host_end, ns_end = f"rd{self.tag}h{i}", f"rd{self.tag}v{i}", f"rd{self.tag}n{i}"
                _ip("netns", "add", name)
                self._made.append(("netns", name))
                _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
                self._made.append(("link", host_end))
                _ip("link", "set", host_end, "master", self.bridge, "up")
                _ip("link", "set", ns_end, "netns", name)
                address = f"{self.subnet}.{11 + i}"
                _ip("addr", "add", f"{address}/24", "dev", ns_end, netns=name)
                _ip("link", "set", ns_end, "up", netns=name)
                _ip("link", "set", "lo", "up", netns=name)
                self.names.append(name)
                self.addresses.append(address)
        except Exception:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        """Delete every namespace and link this object made (processes inside
        must be stopped first)."""
        for kind, name in reversed(self._made):
            try:
                _ip(kind, "del", name)
            except OSError as exc:
                log.warning("could not remove %s %s: %s", kind, name, exc)
        self._made.clear()
        self.names.clear()
        self.addresses.clear()

    def __enter__(self) -> Self:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.remove()
