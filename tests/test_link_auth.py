"""Hostile peers on the node link (engine/link/keys.py): a replayed handshake,
a node key used for another node, a driver that cannot prove the key. A real
channel and real supervisors on loopback, spoken to as an attacker would."""

from __future__ import annotations

import json
import os
import socket
import threading

import psutil
import pytest

from raydist.engine.link.channel import NodeChannel
from raydist.engine.link.keys import Frames, NodeKeys, node_proof
from raydist.engine.link.wire import encode
from tests.test_supervisor import Recorder, _start_at

pytestmark = pytest.mark.component


def _raw(sock: socket.socket) -> bytes:
    """The next line ``sock`` reads, without its newline (b"" at the end)."""
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            return b""
        buf += chunk
    return buf[:-1]


def _line(sock: socket.socket) -> dict:
    """The next line as JSON: a handshake line, sent in clear ({} at the end)."""
    raw = _raw(sock)
    return json.loads(raw) if raw else {}


class _Peer:
    """A node's end of a link after its handshake: every line a sealed frame."""

    def __init__(self, sock: socket.socket, frames: Frames) -> None:
        self.sock, self.frames = sock, frames

    def send(self, message: dict | bytes) -> None:
        """A sealed frame of ``message`` (bytes: a line as it is, JSON or not)."""
        self.sock.sendall(self.frames.seal(message if isinstance(message, bytes) else encode(message)))

    def read(self) -> dict:
        raw = _raw(self.sock)
        return json.loads(self.frames.open(raw)) if raw else {}

    def close(self) -> None:
        self.sock.close()


def _handshake(address: tuple[str, int], hello: dict, proof_for,
               secret: str | None = None) -> tuple[socket.socket, dict, dict, _Peer | None]:
    """Say ``hello``, then the proof ``proof_for(challenge)`` gives; the
    challenge, the driver's answer (a refusal comes in clear; a welcome is
    the first sealed frame, opened with ``secret``), and the node's end."""
    sock = socket.create_connection(address, timeout=5)
    sock.sendall(encode(hello))
    challenge = _line(sock)
    sock.sendall(encode({"type": "proof", "proof": proof_for(challenge)}))
    raw = _raw(sock)
    if secret is None or not raw or raw == b'{"type":"refused"}':
        return sock, challenge, json.loads(raw) if raw else {}, None
    peer = _Peer(sock, Frames.after_handshake(secret, hello["nonce"], challenge["nonce"], driver=False))
    return sock, challenge, json.loads(peer.frames.open(raw)), peer


def test_a_recorded_handshake_replayed_is_refused() -> None:
    rec = Recorder()
    keys = NodeKeys()
    secret = keys.issue("w0")
    ch = NodeChannel("127.0.0.1", keys, rec)
    try:
        hello = {"type": "hello", "key": "w0", "nonce": os.urandom(16).hex(), "host": "h", "pid": 1,
                 "incarnation": "a", "resume": False}
        real, challenge, answer, _ = _handshake((ch.host, ch.port), hello,
                                                lambda c: node_proof(secret, hello, c["nonce"]), secret)
        assert answer == {"type": "welcome"}
        recorded = node_proof(secret, hello, challenge["nonce"])
        real.close()
        # An eavesdropper says the same hello and the same proof again.
        replayed, fresh, answer, _ = _handshake((ch.host, ch.port), hello, lambda c: recorded, secret)
        replayed.close()
        assert fresh["nonce"] != challenge["nonce"]
        assert answer == {"type": "refused"}
        assert [e for e in rec.events if e[0] == "hello"] == [("hello", "w0")]
    finally:
        ch.close()


def test_a_node_key_speaks_for_its_own_node_only() -> None:
    # Whoever reads w0's plan holds w0's key: it must not claim the head (and
    # set the addresses every client dials) or say hello as another worker.
    rec = Recorder()
    keys = NodeKeys()
    keys.issue("head")
    keys.issue("w1")
    mine = keys.issue("w0")
    ch = NodeChannel("127.0.0.1", keys, rec)
    try:
        for other in ("head", "w1"):
            hello = {"type": "hello", "key": other, "nonce": os.urandom(16).hex()}

            def proof(challenge: dict, hello: dict = hello) -> str:
                return node_proof(mine, hello, challenge["nonce"])

            sock, _, answer, _ = _handshake((ch.host, ch.port), hello, proof)
            sock.close()
            assert answer == {"type": "refused"}, other
        assert not [e for e in rec.events if e[0] == "hello"]
    finally:
        ch.close()


def test_a_node_takes_no_word_from_a_driver_that_cannot_prove_its_key() -> None:
    # An impostor listens where the node dials (it won a race for the port,
    # or sits on the path) and answers as the driver would, without the key.
    impostor = socket.create_server(("127.0.0.1", 0))
    impostor.settimeout(20)
    heard: list[bytes] = []

    def play_driver() -> None:
        conn, _ = impostor.accept()
        with conn:
            conn.settimeout(10)
            hello = _line(conn)
            heard.append(json.dumps(hello).encode())
            conn.sendall(encode({"type": "challenge", "nonce": os.urandom(16).hex(), "proof": "0" * 64}))
            conn.sendall(encode({"type": "welcome"}))
            conn.sendall(encode({"type": "head", "address": "10.9.9.9:6379"}))
            try:
                while chunk := conn.recv(4096):
                    heard.append(chunk)
            except OSError:
                pass

    player = threading.Thread(target=play_driver, daemon=True)
    player.start()
    sup = _start_at(impostor.getsockname()[:2], NodeKeys().issue("w0"), [])
    try:
        code = sup.wait(timeout=30)
        player.join(10)
        assert code != 0  # the node refused the link and stopped
        assert heard and b'"type":"hello"' in heard[0].replace(b" ", b"")
        assert not any(b"proof" in chunk for chunk in heard[1:])  # it never answered the impostor
        assert not _in_session(sup.pid)  # and left nothing of its node behind
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, 9)
        impostor.close()


def _in_session(sid: int) -> list[int]:
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (OSError, psutil.Error):
            pass
    return found


def _welcomed(ch: NodeChannel, key: str, secret: str, **fields: object) -> _Peer:
    hello = {"type": "hello", "key": key, "nonce": os.urandom(16).hex(), "host": "h", "pid": 7,
             "incarnation": os.urandom(4).hex(), "resume": False, **fields}
    _, _, answer, peer = _handshake((ch.host, ch.port), hello, lambda c: node_proof(secret, hello, c["nonce"]),
                                    secret)
    assert answer == {"type": "welcome"} and peer is not None, (fields, answer)
    peer.sock.settimeout(10)
    return peer


def _ended(peer: _Peer) -> bool:
    """The driver closed ``peer``'s connection: it reads to the end (what it said first aside)."""
    sock = peer.sock
    sock.settimeout(10)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:  # closed with what we sent still unread
        return True
    except TimeoutError:
        return False
    return True


def test_a_bad_frame_from_a_proven_node_ends_its_own_connection_not_the_channel() -> None:
    # A node with a valid key (its plan was read, or its supervisor is
    # buggy) sends frames raydist cannot use, sealed as the link wants them:
    # each ends that connection, and every other node's link, and the
    # channel, carry on.
    rec = Recorder()
    keys = NodeKeys()
    bystander_secret = keys.issue("w1")
    secret = keys.issue("w0")
    ch = NodeChannel("127.0.0.1", keys, rec)
    try:
        bystander = _welcomed(ch, "w1", bystander_secret)
        odd = _welcomed(ch, "w0", secret, pid="x", host={"a": 1})  # a hello of odd types is taken as far as it can be
        assert ch.links()["w0"].pid == 0
        odd.close()
        frames = [
            {"type": "stopped", "log_tail": 1, "code": "x"},
            {"type": "started", "info": [1, 2], "node_ip": None},
            b"[" * 200_000,  # nested past Python's recursion limit
        ]
        for frame in frames:
            peer = _welcomed(ch, "w0", secret)
            peer.send(frame + b"\n" if isinstance(frame, bytes) else frame)
            if isinstance(frame, bytes):
                assert _ended(peer)  # not a JSON object: its connection ends
            peer.close()
        # A log reply that is not one: a size that is no number, data that is no base64.
        for reply in ({"size": "x", "data": ""}, {"size": 3, "data": "*not base64*"}):
            peer = _welcomed(ch, "w0", secret)
            request = ch.links()["w0"].ask_logs(max_bytes=10)
            asked = peer.read()
            assert asked["type"] == "logs", asked
            peer.send({"type": "logs", "req": asked["req"], "name": "raylet.out", **reply})
            assert _ended(peer), reply
            request.forget()
        # The bystander's link is whole: it is still heard and answered.
        bystander.send({"type": "ping"})
        assert bystander.read() == {"type": "pong"}
        assert not ch.links()["w1"].closed.is_set()
        # ... and the channel takes new nodes.
        again = _welcomed(ch, "w0", secret)
        again.send({"type": "ping"})
        assert again.read() == {"type": "pong"}
        again.close()
        bystander.close()
    finally:
        ch.close()


def test_a_line_injected_changed_or_replayed_on_the_path_ends_the_connection() -> None:
    # What a host between a supervisor and the driver can do to a link it
    # cannot seal: each attempt is caught at its first frame.
    rec = Recorder()
    keys = NodeKeys()
    secret = keys.issue("w0")
    ch = NodeChannel("127.0.0.1", keys, rec)
    try:
        injected = _welcomed(ch, "w0", secret)
        injected.sock.sendall(encode({"type": "stopped", "code": 0, "reason": "injected"}))  # no MAC
        assert _ended(injected)
        changed = _welcomed(ch, "w0", secret)
        sealed = changed.frames.seal(encode({"type": "log", "line": "honest"}))
        changed.sock.sendall(sealed.replace(b"honest", b"forged"))
        assert _ended(changed)
        replayed = _welcomed(ch, "w0", secret)
        frame = replayed.frames.seal(encode({"type": "ping"}))
        replayed.sock.sendall(frame)
        assert replayed.read() == {"type": "pong"}
        replayed.sock.sendall(frame)  # the same frame again: its count is past
        assert _ended(replayed)
        assert not [e for e in rec.events if e[0] == "stopped"]  # the injected "stopped" was never heard
    finally:
        ch.close()


def test_a_node_takes_no_unsealed_or_replayed_line_from_the_path() -> None:
    # The node's end of the same: a `head` address or a `stop` injected
    # between the driver and the node is not taken.
    from raydist.engine.link.wire import LineReader, LinkBroken

    driver_frames = Frames.after_handshake("k" * 64, "a" * 32, "b" * 32, driver=True)
    head = driver_frames.seal(encode({"type": "head", "address": "10.0.0.1:6379"}))
    for on_the_wire in (encode({"type": "head", "address": "10.9.9.9:6379"}),  # injected, no MAC
                        head.replace(b"10.0.0.1", b"10.9.9.9"),  # changed
                        head + head):  # the real one, then replayed
        ours, theirs = socket.socketpair()
        with ours, theirs:
            reader = LineReader(ours, idle_s=2, frames=Frames.after_handshake("k" * 64, "a" * 32, "b" * 32,
                                                                              driver=False))
            theirs.sendall(on_the_wire)
            if on_the_wire.startswith(head):
                assert reader.read() == {"type": "head", "address": "10.0.0.1:6379"}
            with pytest.raises(LinkBroken, match="MAC"):
                reader.read()


def test_a_node_sends_no_more_logs_than_were_asked_for() -> None:
    rec = Recorder()
    keys = NodeKeys()
    secret = keys.issue("w0")
    ch = NodeChannel("127.0.0.1", keys, rec)
    try:
        peer = _welcomed(ch, "w0", secret)
        request = ch.links()["w0"].ask_logs(max_bytes=1000)
        asked = peer.read()
        import base64

        chunk = base64.b64encode(b"x" * 600).decode()
        for i in range(50):  # 30 KB against the 1,000 bytes asked for
            peer.send({"type": "logs", "req": asked["req"], "name": f"f{i}", "size": 600, "data": chunk})
        files = request.wait(10)  # answered with what fits, without waiting for a "done"
        assert sum(len(data) for _, _, data in files) <= 1000
        assert [name for name, _, _ in files] == ["f0"]
        peer.close()
    finally:
        ch.close()


def test_a_replaced_connection_is_told_to_stop_and_closed_even_if_it_keeps_pinging() -> None:
    rec = Recorder()
    keys = NodeKeys()
    secret = keys.issue("w0")
    ch = NodeChannel("127.0.0.1", keys, rec)
    try:
        stale = _welcomed(ch, "w0", secret)
        fresh = _welcomed(ch, "w0", secret)  # the slot's task ran again: a new supervisor
        heard = []
        try:
            for _ in range(50):  # the old one goes on pinging, as a wedged supervisor would
                stale.send({"type": "ping"})
                line = stale.read()
                if not line:
                    break
                heard.append(line)
        except OSError:
            pass
        assert {"type": "stop"} in heard and len(heard) < 50, heard
        fresh.send({"type": "ping"})
        assert fresh.read() == {"type": "pong"}  # the new one is the node's link
        assert ch.links()["w0"].incarnation != ""
        fresh.close()
        stale.close()
    finally:
        ch.close()
