"""Every message of the node link, in one place: its kind, its fields, who sends it.

A message is a JSON object on one line (:mod:`~raydist.engine.link.wire`)
whose ``"type"`` names its kind: the one key every end reads
(:func:`kind`). Each end builds what it sends with the typed functions below,
so a field's name and type are written once; what an end receives is checked
where it is read (on the driver, a field of the wrong type ends that one
connection: ``channel._lines``).

The handshake, in clear (``keys.say_hello``, ``handshake.Handshakes``)::

    node -> driver   hello {key, nonce, host, pid, incarnation, resume}
    driver -> node   challenge {nonce, proof}  |  refused
    node -> driver   proof {proof}
    driver -> node   welcome                   |  refused

then sealed frames (``keys.Frames``)::

    node -> driver   ping | log {line} | started {node_ip, info} | demand {...}
                     | stopped {code, reason, log_tail} | logs {req, name, size, data | done}
                     | dashboard {req, url | error}
    driver -> node   pong | stop {hard} | head {address} | logs {req, name, offset, max_bytes}
                     | dashboard {req, stop}

and on a relay's control connection (``relay``)::

    driver -> relay  relay-control {nonce}, proof {proof}, ping
    relay -> driver  challenge {nonce}, dial {id, source}, ping
    driver -> relay  relay-pair {id, proof}  (a new connection, paired with a node's)
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

from raydist.engine.nodelogs import CHUNK, LogFile

__all__ = [
    "KIND", "challenge", "dashboard", "dashboard_answer", "demand", "dial", "head", "hello", "kind", "log",
    "logs", "logs_parts", "ping", "pong", "proof", "refused", "relay_control", "relay_pair", "started", "stop",
    "stopped", "welcome",
]

#: The key that names a message's kind, in every message both ways.
KIND = "type"


def kind(message: object) -> str:
    """A message's kind, or "" for anything that is not a message."""
    return str(message.get(KIND, ""))[:32] if isinstance(message, dict) else ""


# -- the handshake (clear) ---------------------------------------------------

def hello(key: str, nonce: str, **who: Any) -> dict[str, Any]:
    """A supervisor's first line: its node key, a fresh nonce, who it is."""
    return {KIND: "hello", "key": key, "nonce": nonce, **who}


def challenge(nonce: str, proof: str | None = None) -> dict[str, Any]:
    """The answer to a hello (with the driver's proof) or to a relay's control connection (without)."""
    return {KIND: "challenge", "nonce": nonce, **({"proof": proof} if proof is not None else {})}


def proof(value: str) -> dict[str, Any]:
    return {KIND: "proof", "proof": value}


def welcome() -> dict[str, Any]:
    return {KIND: "welcome"}


def refused() -> dict[str, Any]:
    """The driver's no: sent in clear, the only line that may follow a proof unsealed."""
    return {KIND: "refused"}


# -- both ways, sealed -------------------------------------------------------

def ping() -> dict[str, Any]:
    return {KIND: "ping"}


def pong() -> dict[str, Any]:
    return {KIND: "pong"}


# -- node -> driver ----------------------------------------------------------

def log(line: str) -> dict[str, Any]:
    """One line of what the node's processes printed."""
    return {KIND: "log", "line": line}


def started(node_ip: str, info: dict[str, Any]) -> dict[str, Any]:
    """The node is up: the address Ray gave it, and its ports and ids."""
    return {KIND: "started", "node_ip": node_ip, "info": info}


def demand(reading: dict[str, Any]) -> dict[str, Any]:
    """What the head's Ray could not place, read beside it (``node.demand``)."""
    return {**reading, KIND: "demand"}


def stopped(code: int | None, reason: str, log_tail: list[str] | None = None) -> dict[str, Any]:
    """The node's processes are gone, and why."""
    return {KIND: "stopped", "code": code, "reason": reason, "log_tail": list(log_tail or [])}


def logs_parts(req: str, files: list[LogFile]) -> Iterator[dict[str, Any]]:
    """The answer to a ``logs`` request: each file in base64 parts, then one that says done."""
    for name, size, data in files:
        for at in range(0, max(len(data), 1), CHUNK):
            yield {KIND: "logs", "req": req, "name": name, "size": size,
                   "data": base64.b64encode(data[at:at + CHUNK]).decode()}
    yield {KIND: "logs", "req": req, "done": True}


def dashboard_answer(req: str, *, url: str = "", error: str = "") -> dict[str, Any]:
    """The answer to a ``dashboard`` request: the URL it serves, or why not."""
    return {KIND: "dashboard", "req": req, **({"error": error} if error else {"url": url})}


# -- driver -> node ----------------------------------------------------------

def stop(*, hard: bool = False) -> dict[str, Any]:
    """End the node; ``hard``: without Ray's graceful stop (the whole cluster goes)."""
    return {KIND: "stop", "hard": True} if hard else {KIND: "stop"}


def head(address: str) -> dict[str, Any]:
    """Where the head's GCS listens, for a worker whose head runs in a Spark task."""
    return {KIND: "head", "address": address}


def logs(req: str, *, name: str, offset: int, max_bytes: int) -> dict[str, Any]:
    """Ask a node for its Ray log files (``name``: one of them, or every one)."""
    return {KIND: "logs", "req": req, "max_bytes": max_bytes, "name": name, "offset": offset}


def dashboard(req: str, *, stop: bool) -> dict[str, Any]:
    """Ask a head to start Ray's whole dashboard, or (``stop``) to go back to the small one."""
    return {KIND: "dashboard", "req": req, "stop": stop}


# -- a relay's control connection --------------------------------------------

def relay_control(nonce: str) -> dict[str, Any]:
    return {KIND: "relay-control", "nonce": nonce}


def relay_pair(link_id: str, proof: str) -> dict[str, Any]:
    return {KIND: "relay-pair", "id": link_id, "proof": proof}


def dial(link_id: str, source: str | None = None) -> dict[str, Any]:
    """The relay asks the driver to dial a pair for a node waiting at it (from ``source``)."""
    return {KIND: "dial", "id": link_id, **({"source": source} if source is not None else {})}
