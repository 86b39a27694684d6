"""The link between a cluster's driver and each of its node supervisors.

Every Ray node of a cluster (the head on the driver, each worker in a Spark
task) runs under a supervisor process that holds one TCP connection to this
channel on the driver. The connection is the cluster's nervous system:

* a supervisor says ``hello`` (with the cluster's secret), streams the output
  of ``ray start``, says ``started`` once its node is up, and ``stopped`` once
  every process of its node is gone;
* the driver says ``stop`` to tear a node down at once, without waiting for
  Spark to kill the task;
* if the connection drops, each side knows the other is gone: the driver marks
  the node lost, the supervisor kills its node (the driver died, so nothing
  may be left running).

Messages are JSON objects, one per line. The secret is compared in constant
time and never logged.
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NodeChannel", "NodeLink", "send", "LOG_TAIL_LINES"]

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40


def send(sock: socket.socket, lock: threading.Lock, message: dict[str, Any]) -> bool:
    """Write one message; False if the peer is gone."""
    data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
    try:
        with lock:
            sock.sendall(data)
        return True
    except OSError:
        return False


def enable_keepalive(sock: socket.socket) -> None:
    """Detect a dead peer on another host within about 15 s."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 5)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)


@dataclass
class NodeLink:
    """What the driver knows about one connected supervisor."""

    key: str
    host: str = ""
    pid: int = 0
    node_ip: str = ""
    started: bool = False
    stopped: bool = False
    exit_code: int | None = None
    info: dict[str, Any] = field(default_factory=dict)
    log_tail: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_TAIL_LINES))
    _sock: socket.socket | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    closed: threading.Event = field(default_factory=threading.Event)

    def stop(self) -> None:
        """Ask the supervisor to tear its node down now."""
        if self._sock is not None:
            send(self._sock, self._lock, {"cmd": "stop"})


#: Called with (event, link): event is "hello", "started", "log", "stopped" or "closed".
Listener = Callable[[str, NodeLink], None]


class NodeChannel:
    """Driver-side server that every supervisor of one cluster connects to."""

    def __init__(self, host: str, secret: str, listener: Listener) -> None:
        self._secret = secret.encode()
        self._listener = listener
        self._server = socket.create_server((host, 0), backlog=64)
        self.host = host
        self.port: int = self._server.getsockname()[1]
        self._links: dict[str, NodeLink] = {}
        self._lock = threading.Lock()
        self._closing = False
        self._stopped = False  # after stop_all(): every node, also one that says hello later, is told to stop
        self._thread = threading.Thread(target=self._accept, name=f"raydist-channel-{self.port}", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def links(self) -> dict[str, NodeLink]:
        with self._lock:
            return dict(self._links)

    def stop_all(self) -> None:
        """Tell every node to stop, and every node that connects from now on."""
        with self._lock:
            self._stopped = True
            links = list(self._links.values())
        for link in links:
            link.stop()

    def close(self) -> None:
        """Stop accepting and drop every connection (supervisors then stop their nodes)."""
        self._closing = True
        try:
            self._server.close()
        except OSError:
            pass
        for link in self.links().values():
            if link._sock is not None:
                try:
                    link._sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    # internals -------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True, name="raydist-channel-conn").start()

    def _serve(self, conn: socket.socket) -> None:
        enable_keepalive(conn)
        link: NodeLink | None = None
        try:
            reader = conn.makefile("r", encoding="utf-8", errors="replace")
            first = reader.readline()
            hello = json.loads(first) if first else {}
            given = str(hello.get("secret", "")).encode()
            if hello.get("type") != "hello" or not hmac.compare_digest(given, self._secret):
                log.warning("refused a node connection without the cluster's secret")
                return
            key = str(hello.get("key"))
            link = NodeLink(key=key, host=str(hello.get("host", "")), pid=int(hello.get("pid", 0)), _sock=conn)
            with self._lock:
                old = self._links.get(key)
                self._links[key] = link
                late = self._stopped or self._closing
            if old is not None and old._sock is not None:
                # A resubmitted node replaces a stale connection of the same slot.
                old.stop()
            if late:
                # The cluster is going away: a supervisor that connects now (its
                # task started late, on a loaded host) stops its node at once
                # instead of running one nobody will stop.
                link.stop()
            self._listener("hello", link)
            for line in reader:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                kind = msg.get("type")
                if kind == "log":
                    link.log_tail.append(str(msg.get("line", "")))
                    self._listener("log", link)
                elif kind == "started":
                    link.started = True
                    link.node_ip = str(msg.get("node_ip", ""))
                    link.info = dict(msg.get("info", {}))
                    self._listener("started", link)
                elif kind == "stopped":
                    link.stopped = True
                    link.exit_code = msg.get("code")
                    for tail_line in msg.get("log_tail", []):
                        link.log_tail.append(str(tail_line))
                    self._listener("stopped", link)
        except (OSError, ValueError) as exc:
            log.debug("node connection ended: %s", exc)
        finally:
            try:
                conn.close()
            except OSError:
                pass
            if link is not None:
                link.closed.set()
                self._listener("closed", link)
