"""Who may speak on a cluster's node link, and how each end proves it.

The driver holds the cluster's link secret and never sends it anywhere. Each
node key the cluster issues (``head``, ``w0``, ``w1``...) gets a key of its
own, derived from that secret (HMAC-SHA256 over the node key), and a node's
plan carries only its own. So a process that reads one node's plan can speak
for that node alone: it cannot claim ``head`` (and set the addresses every
client dials) or stop another node.

A link opens with three lines, each end proving the node's key to the other
over nonces it has never seen, so nothing recorded from one handshake opens
another:

* node to driver, ``hello``: its key, a fresh nonce, who it is (host, pid,
  incarnation, resume);
* driver to node, ``challenge``: a fresh nonce and the driver's proof, a MAC
  over the hello and both nonces: only a driver that issued the key can say
  it, so a node never takes orders (``stop``, the head's address) from an
  impostor;
* node to driver, ``proof``: the node's MAC over the same, under another
  label; the driver then says ``welcome``, or ``refused``.

The head's relay (:mod:`raydist.engine.relay`) admits the driver's dial-outs
with a key derived from the head's key, by a challenge of its own.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import threading
from typing import Any

from raydist.engine.wire import HANDSHAKE_S, LineReader, LinkBroken, LinkClosed, LinkRefused, encode

__all__ = ["NodeKeys", "driver_proof", "fresh_nonce", "node_proof", "proven", "relay_key", "relay_proof",
           "say_hello"]

_NONCE_BYTES = 16
#: The hello fields a proof covers (what the driver acts on).
_HELLO_FIELDS = ("type", "key", "nonce", "host", "pid", "incarnation", "resume")


def fresh_nonce() -> str:
    return secrets.token_hex(_NONCE_BYTES)


def _mac(key: str, *parts: str) -> str:
    return hmac.new(key.encode(), "\0".join(parts).encode(), hashlib.sha256).hexdigest()


def _said(hello: dict[str, Any]) -> str:
    """The hello as both ends sign it: the fields the driver acts on, in one order."""
    return json.dumps({k: hello.get(k) for k in _HELLO_FIELDS}, sort_keys=True, separators=(",", ":"))


def driver_proof(node_secret: str, hello: dict[str, Any], nonce: str) -> str:
    """The driver's answer to ``hello``, with its own fresh ``nonce``."""
    return _mac(node_secret, "driver", _said(hello), nonce)


def node_proof(node_secret: str, hello: dict[str, Any], nonce: str) -> str:
    """The node's answer to the driver's challenge ``nonce``."""
    return _mac(node_secret, "node", _said(hello), nonce)


def relay_key(head_secret: str) -> str:
    """The key the head's relay admits the driver with (the head's task holds
    the head's key; the relay never learns the cluster's secret)."""
    return _mac(head_secret, "relay")


def relay_proof(relay_secret: str, purpose: str, nonce: str) -> str:
    """The driver's proof for a relay connection: ``purpose`` is
    ``relay-control`` (over the relay's fresh nonce) or ``relay-pair`` (over
    the pair's one-time id)."""
    return _mac(relay_secret, purpose, nonce)


def proven(expected: str, given: object) -> bool:
    """Whether ``given`` is ``expected``, compared in constant time."""
    return isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode())


class NodeKeys:
    """A cluster's link secret and the node keys issued under it.

    Only the driver holds one. :meth:`issue` is the one way a node key comes
    to exist; :meth:`secret_of` answers only for keys issued, so a hello that
    names any other key is refused before it costs more than a line.
    """

    def __init__(self, secret: str | None = None) -> None:
        self._secret = secret or secrets.token_hex(32)
        self._issued: set[str] = set()
        self._lock = threading.Lock()

    def issue(self, key: str) -> str:
        """The node secret for ``key``, for that node's plan alone."""
        with self._lock:
            self._issued.add(key)
        return _mac(self._secret, "node", key)

    def secret_of(self, key: str) -> str | None:
        """``key``'s node secret, or None for a key never issued."""
        with self._lock:
            if key not in self._issued:
                return None
        return _mac(self._secret, "node", key)

    def __repr__(self) -> str:
        return "NodeKeys(****)"


def say_hello(sock: socket.socket, key: str, node_secret: str, **who: Any) -> tuple[dict[str, Any], bytes]:
    """The node's side of the handshake on a fresh connection: the hello it
    said and whatever the driver sent past its ``welcome`` (the next line
    may already be in). Raises LinkRefused when the driver says no, and
    LinkBroken when the link breaks or the far end cannot prove the key
    (an impostor)."""
    hello = {"type": "hello", "key": key, "nonce": fresh_nonce(), **who}
    sock.sendall(encode(hello))
    reader = LineReader(sock, idle_s=HANDSHAKE_S)
    try:
        challenge = reader.read()
        if challenge.get("type") == "refused":
            raise LinkRefused("the driver refused this node's hello")
        nonce = str(challenge.get("nonce", ""))
        if challenge.get("type") != "challenge" or not proven(driver_proof(node_secret, hello, nonce),
                                                               challenge.get("proof")):
            # An impostor, or this node's key is wrong: neither gets better with retries.
            raise LinkRefused("the far end of the link could not prove this node's key")
        sock.sendall(encode({"type": "proof", "proof": node_proof(node_secret, hello, nonce)}))
        welcome = reader.read()
    except LinkRefused:
        raise
    except LinkClosed as exc:
        # Not a refusal: the driver's handshake timer may have fired on a
        # hello that a blip swallowed.
        raise LinkBroken("the driver closed the link during the handshake") from exc
    if welcome.get("type") == "refused":
        raise LinkRefused("the driver refused this node's proof")
    if welcome.get("type") != "welcome":
        raise LinkBroken("the driver did not welcome this node")
    return hello, reader.rest()
