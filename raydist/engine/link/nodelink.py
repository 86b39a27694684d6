"""What the driver knows of one node's supervisor over the node link
(:mod:`raydist.engine.link.channel` keeps one per node key), and the commands
it sends that node."""

from __future__ import annotations

import base64
import secrets
import socket
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raydist.engine.link import messages
from raydist.engine.link.wire import MAX_LINE, encode
from raydist.engine.nodelogs import NODE_BYTES, LogFile

__all__ = ["LOG_TAIL_LINES", "LogRequest", "NodeLink"]

LOG_TAIL_LINES = 40
#: The most files one answer for a node's logs may name.
MAX_LOG_FILES = 1000


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
    #: Why the node stopped, as its supervisor said (``stopped``), or how its
    #: link ended without that (the channel's words); "" while it runs.
    end_reason: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    demand: dict[str, Any] = field(default_factory=dict)  # the head's last demand reading (elastic clusters)
    log_tail: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_TAIL_LINES))
    _sock: socket.socket | None = None
    #: The channel's way to queue bytes on this link's connection (never blocks).
    _post: Callable[[NodeLink, bytes], bool] | None = None
    closed: threading.Event = field(default_factory=threading.Event)
    _log_requests: dict[str, dict[str, Any]] = field(default_factory=dict)  # fetch_logs calls waiting
    _dashboard_requests: dict[str, dict[str, Any]] = field(default_factory=dict)  # switch_dashboard calls waiting

    def heard(self, msg: dict[str, Any]) -> str | None:
        """Take in one message from this node's supervisor; returns the event
        its listeners hear ("log", "started", "demand", "stopped"), or None.
        A field of the wrong type raises: the channel ends this connection."""
        kind = messages.kind(msg)
        if kind == "ping":
            self.tell(messages.pong())
        elif kind == "log":
            self.log_tail.append(str(msg.get("line", "")))
            return "log"
        elif kind == "started":
            self.started = True
            self.node_ip = str(msg.get("node_ip", ""))
            info = msg.get("info", {})
            self.info = dict(info) if isinstance(info, dict) else {}
            return "started"
        elif kind == "demand":
            self.demand = msg
            return "demand"
        elif kind == "logs":
            self._on_logs(msg)
        elif kind == "dashboard":
            self._on_dashboard(msg)
        elif kind == "stopped":
            self.stopped = True
            code = msg.get("code")
            self.exit_code = code if isinstance(code, int) else None
            self.end_reason = str(msg.get("reason", ""))[:500]
            tail = msg.get("log_tail")
            for tail_line in tail[-LOG_TAIL_LINES:] if isinstance(tail, list) else ():
                self.log_tail.append(str(tail_line)[:MAX_LINE])
            return "stopped"
        return None

    def ended_why(self) -> str:
        """Why this node is gone, for an error a user reads: the
        supervisor's reason and exit code, or how the link ended."""
        why = self.end_reason or ("its supervisor said it stopped" if self.stopped else "its link closed")
        return why + (f" (exit code {self.exit_code})" if self.exit_code else "")

    def stop(self, *, hard: bool = False) -> None:
        """Ask the supervisor to tear its node down now; ``hard``: kill its
        Ray processes at once, without Ray's graceful stop (the whole
        cluster goes: nothing is left for a node to drain to)."""
        self.tell(messages.stop(hard=hard))

    def fetch_logs(self, *, max_bytes: int = NODE_BYTES, name: str = "", offset: int = 0,
                   timeout: float = 10.0) -> list[LogFile]:
        """The node's log files as its supervisor reads them now (see
        :func:`raydist.engine.nodelogs.read_logs`); TimeoutError when it does
        not answer within ``timeout`` seconds (its link is down, or it is gone)."""
        return self.ask_logs(max_bytes=max_bytes, name=name, offset=offset).wait(timeout)

    def ask_logs(self, *, max_bytes: int = NODE_BYTES, name: str = "", offset: int = 0) -> LogRequest:
        """Ask for the node's logs and return at once; the answer's
        :meth:`LogRequest.wait` waits for it (many nodes can be asked at once
        with no thread each)."""
        req = LogRequest(self, secrets.token_hex(6), max_bytes)
        self._log_requests[req.id] = req.box
        self.tell(messages.logs(req.id, name=name, offset=offset, max_bytes=max_bytes))
        return req

    def switch_dashboard(self, *, stop: bool = False, timeout: float = 90.0) -> str:
        """Have this head's supervisor run Ray's dashboard with every module
        (or, ``stop``, without it again); its URL once it answers.
        TimeoutError when no answer comes within ``timeout`` s; RuntimeError
        with the supervisor's words when it could not."""
        req = secrets.token_hex(6)
        box: dict[str, Any] = {"done": threading.Event()}
        self._dashboard_requests[req] = box
        try:
            self.tell(messages.dashboard(req, stop=stop))
            if not box["done"].wait(timeout):
                raise TimeoutError(f"node {self.key} did not switch Ray's dashboard within {timeout:g} s")
        finally:
            self._dashboard_requests.pop(req, None)
        if box.get("error"):
            raise RuntimeError(box["error"])
        return str(box["url"])

    def _on_dashboard(self, msg: dict[str, Any]) -> None:
        box = self._dashboard_requests.get(str(msg.get("req", "")))
        if box is None:
            return  # an answer nobody waits for any more
        box["url"], box["error"] = str(msg.get("url", ""))[:300], str(msg.get("error", ""))[:500]
        box["done"].set()

    def _on_logs(self, msg: dict[str, Any]) -> None:
        box = self._log_requests.get(str(msg.get("req", "")))
        if box is None:
            return  # an answer nobody waits for any more
        if msg.get("done"):
            box["done"].set()
            return
        name = str(msg.get("name", ""))[:255]
        size = msg.get("size", 0)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"a log reply's size is {size!r}, not a byte count")
        data = base64.b64decode(str(msg.get("data", "")), validate=True)
        box["got"] += len(data)
        if box["got"] > box["limit"] or (name not in box["files"] and len(box["files"]) >= MAX_LOG_FILES):
            # More than was asked for: the answer ends here, with what fits.
            box["truncated"] = True
            box["done"].set()
            self._log_requests.pop(str(msg.get("req", "")), None)
            return
        entry = box["files"].setdefault(name, (size, bytearray()))
        entry[1].extend(data)

    def tell(self, message: dict[str, Any]) -> bool:
        """Send the supervisor a command (``stop``; ``head`` with its address).
        Never blocks: the message is queued on the link (False when the link
        is down now and the message is lost)."""
        return self._post is not None and self._post(self, encode(message))


class LogRequest:
    """One request for a node's logs, answered over its link."""

    def __init__(self, link: NodeLink, req: str, max_bytes: int = NODE_BYTES) -> None:
        self.link = link
        self.id = req
        # What the node may send for it: ``max_bytes`` of file contents, and
        # no more files than a node's log directory keeps.
        self.box: dict[str, Any] = {"files": {}, "done": threading.Event(), "got": 0, "limit": max(0, max_bytes),
                                    "truncated": False}

    def wait(self, timeout: float) -> list[LogFile]:
        """The files, once the node sent them all; TimeoutError after ``timeout`` s."""
        try:
            if not self.box["done"].wait(max(0.0, timeout)):
                raise TimeoutError(f"node {self.link.key} sent no logs within {timeout:g} s")
        finally:
            self.forget()
        return [(name, size, bytes(data)) for name, (size, data) in self.box["files"].items()]

    def forget(self) -> None:
        """Nobody waits for the answer any more (what still comes is dropped)."""
        self.link._log_requests.pop(self.id, None)
