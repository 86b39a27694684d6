"""What the driver knows of one node's supervisor over the node link
(:mod:`raydist.engine.channel` keeps one per node key), and the commands
it sends that node."""

from __future__ import annotations

import base64
import secrets
import socket
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from raydist.engine.nodelogs import NODE_BYTES, LogFile
from raydist.engine.wire import send

__all__ = ["LOG_TAIL_LINES", "NodeLink"]

LOG_TAIL_LINES = 40


@dataclass
class NodeLink:
    """What the driver knows about one connected supervisor.

    One NodeLink lives as long as its supervisor: when the supervisor
    reconnects after a broken link it resumes the same NodeLink (same
    ``incarnation``), so listeners see one node, not a new one.
    """

    key: str
    host: str = ""
    pid: int = 0
    incarnation: str = ""
    node_ip: str = ""
    started: bool = False
    stopped: bool = False
    exit_code: int | None = None
    info: dict[str, Any] = field(default_factory=dict)
    demand: dict[str, Any] = field(default_factory=dict)  # the head's last demand reading (elastic clusters)
    log_tail: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_TAIL_LINES))
    _sock: socket.socket | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    closed: threading.Event = field(default_factory=threading.Event)
    _log_requests: dict[str, dict[str, Any]] = field(default_factory=dict)  # fetch_logs calls waiting

    def stop(self, *, hard: bool = False) -> None:
        """Ask the supervisor to tear its node down now; ``hard``: kill its
        Ray processes at once, without Ray's graceful stop (the whole
        cluster goes: nothing is left for a node to drain to)."""
        self.tell({"cmd": "stop", "hard": True} if hard else {"cmd": "stop"})

    def fetch_logs(self, *, max_bytes: int = NODE_BYTES, name: str = "", offset: int = 0,
                   timeout: float = 10.0) -> list[LogFile]:
        """The node's log files as its supervisor reads them now (see
        :func:`raydist.engine.nodelogs.read_logs`); TimeoutError when it does
        not answer within ``timeout`` seconds (its link is down, or it is gone)."""
        req = secrets.token_hex(6)
        box: dict[str, Any] = {"files": {}, "done": threading.Event()}
        self._log_requests[req] = box
        try:
            self.tell({"cmd": "logs", "req": req, "max_bytes": max_bytes, "name": name, "offset": offset})
            if not box["done"].wait(timeout):
                raise TimeoutError(f"node {self.key} sent no logs within {timeout:g} s")
        finally:
            self._log_requests.pop(req, None)
        return [(name, size, bytes(data)) for name, (size, data) in box["files"].items()]

    def _on_logs(self, msg: dict[str, Any]) -> None:
        box = self._log_requests.get(str(msg.get("req", "")))
        if box is None:
            return  # an answer nobody waits for any more
        if msg.get("done"):
            box["done"].set()
            return
        name = str(msg.get("name", ""))
        entry = box["files"].setdefault(name, (int(msg.get("size", 0)), bytearray()))
        entry[1].extend(base64.b64decode(str(msg.get("data", ""))))

    def tell(self, message: dict[str, Any]) -> None:
        """Send the supervisor a command (``stop``; ``head`` with its address)."""
        if self._sock is not None:
            send(self._sock, self._lock, message)
