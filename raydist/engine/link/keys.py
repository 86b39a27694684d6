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

Every line after the proof, both ways, welcome included, is a sealed frame
(:class:`Frames`): the JSON, a tab, and a MAC over the line and its place in
the connection's stream, under a key of the connection's own (derived from
the node's key and both nonces, one per direction). So a host on the path
can neither inject a line (``{"type":"head","address":"evil:6379"}``, ``stop``),
change one, drop one unnoticed, nor replay one on this or another
connection. Nothing secret crosses the link (the Ray token rides in the
node's plan, in its Spark task), so the frames are signed, not encrypted.

The head's relay (:mod:`raydist.engine.link.relay`) admits the driver's dial-outs
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

from raydist.engine.link import messages
from raydist.engine.link.wire import HANDSHAKE_S, LineReader, LinkBroken, LinkClosed, LinkRefused, encode

__all__ = ["BadFrame", "Frames", "NodeKeys", "driver_proof", "fresh_nonce", "node_proof", "proven", "relay_key",
           "relay_proof", "say_hello"]

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


def relay_key(head_node_secret: str) -> str:
    """The key the head's relay admits the driver with (the head's task holds
    the head's key; the relay never learns the cluster's secret)."""
    return _mac(head_node_secret, "relay")


def relay_proof(relay_secret: str, purpose: str, nonce: str) -> str:
    """The driver's proof for a relay connection: ``purpose`` is
    ``relay-control`` (over the relay's fresh nonce) or ``relay-pair`` (over
    the pair's one-time id)."""
    return _mac(relay_secret, purpose, nonce)


#: Hex digits of a frame's MAC (128 bits of HMAC-SHA256).
_FRAME_MAC_HEX = 32


class BadFrame(ValueError):
    """A line whose MAC does not hold: injected, changed, replayed or out of order."""


class Frames:
    """Sealing and opening the frames of one connection, after its handshake.

    ``seal`` is called by one writer at a time (each end holds its link's
    send lock) and ``open`` by the connection's one reader: each direction
    counts its frames, and a frame's MAC covers its count.
    """

    def __init__(self, send_key: bytes, receive_key: bytes) -> None:
        self._send_key, self._receive_key = send_key, receive_key
        self._sent = 0
        self._received = 0

    @classmethod
    def after_handshake(cls, node_secret: str, hello_nonce: str, driver_nonce: str, *, driver: bool) -> Frames:
        """The frames of the connection whose handshake used these nonces, as
        the driver (``driver``) or the node sees them."""
        base = hmac.new(node_secret.encode(), f"link-session\0{hello_nonce}\0{driver_nonce}".encode(),
                        hashlib.sha256).digest()
        to_node = hmac.new(base, b"driver-to-node", hashlib.sha256).digest()
        to_driver = hmac.new(base, b"node-to-driver", hashlib.sha256).digest()
        return cls(to_node, to_driver) if driver else cls(to_driver, to_node)

    @staticmethod
    def _mac(key: bytes, count: int, line: bytes) -> bytes:
        return hmac.new(key, count.to_bytes(8, "big") + line, hashlib.sha256).hexdigest()[:_FRAME_MAC_HEX].encode()

    def seal(self, encoded: bytes) -> bytes:
        """``encoded`` (one message as :func:`~raydist.engine.link.wire.encode`
        gives it) as this connection's next frame."""
        line = encoded[:-1] if encoded.endswith(b"\n") else encoded
        mac = self._mac(self._send_key, self._sent, line)
        self._sent += 1
        return line + b"\t" + mac + b"\n"

    def open(self, frame: bytes) -> bytes:
        """The line in ``frame`` (without its newline), if it is the next
        frame the far end sealed; BadFrame otherwise."""
        line, tab, mac = frame.rpartition(b"\t")
        if not tab or not hmac.compare_digest(mac, self._mac(self._receive_key, self._received, line)):
            raise BadFrame("a frame whose MAC does not hold")
        self._received += 1
        return line


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


def say_hello(sock: socket.socket, key: str, node_secret: str,
              **who: Any) -> tuple[dict[str, Any], bytes, Frames]:
    """The node's side of the handshake on a fresh connection: the hello it
    said, whatever the driver sent past its ``welcome`` (the next frame may
    already be in), and the connection's :class:`Frames`. Raises
    LinkRefused when the driver says no, and LinkBroken when the link breaks
    or the far end cannot prove the key (an impostor)."""
    hello = messages.hello(key, fresh_nonce(), **who)
    sock.sendall(encode(hello))
    reader = LineReader(sock, idle_s=HANDSHAKE_S)
    try:
        challenge = reader.read()
        if messages.kind(challenge) == "refused":
            raise LinkRefused("the driver refused this node's hello")
        nonce = str(challenge.get("nonce", ""))
        if messages.kind(challenge) != "challenge" or not proven(driver_proof(node_secret, hello, nonce),
                                                               challenge.get("proof")):
            # An impostor, or this node's key is wrong: neither gets better with retries.
            raise LinkRefused("the far end of the link could not prove this node's key")
        sock.sendall(encode(messages.proof(node_proof(node_secret, hello, nonce))))
        frames = Frames.after_handshake(node_secret, hello["nonce"], nonce, driver=False)
        reader = LineReader(sock, idle_s=HANDSHAKE_S, initial=reader.rest(), frames=frames, refusal_in_clear=True)
        welcome = reader.read()
    except LinkRefused:
        raise
    except LinkClosed as exc:
        # Not a refusal: the driver's handshake timer may have fired on a
        # hello that a blip swallowed.
        raise LinkBroken("the driver closed the link during the handshake") from exc
    if messages.kind(welcome) == "refused":
        raise LinkRefused("the driver refused this node's proof")
    if messages.kind(welcome) != "welcome":
        raise LinkBroken("the driver did not welcome this node")
    return hello, reader.rest(), frames
