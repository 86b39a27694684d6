"""Hostile peers on the node link (engine/linkauth.py): a replayed handshake,
a node key used for another node, a driver that cannot prove the key. A real
channel and real supervisors on loopback, spoken to as an attacker would."""

from __future__ import annotations

import json
import os
import socket
import threading

import psutil
import pytest

from raydist.engine.channel import NodeChannel
from raydist.engine.linkauth import NodeKeys, node_proof
from raydist.engine.wire import encode
from tests.test_supervisor import Recorder, _start_at

pytestmark = pytest.mark.component


def _line(sock: socket.socket) -> dict:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            return {}
        buf += chunk
    return json.loads(buf)


def _handshake(address: tuple[str, int], hello: dict, proof_for) -> tuple[socket.socket, dict, dict]:
    """Say ``hello``, then the proof ``proof_for(challenge)`` gives; the
    challenge and the driver's answer."""
    sock = socket.create_connection(address, timeout=5)
    sock.sendall(encode(hello))
    challenge = _line(sock)
    sock.sendall(encode({"type": "proof", "proof": proof_for(challenge)}))
    return sock, challenge, _line(sock)


def test_a_recorded_handshake_replayed_is_refused() -> None:
    rec = Recorder()
    keys = NodeKeys()
    secret = keys.issue("w0")
    ch = NodeChannel("127.0.0.1", keys, rec)
    try:
        hello = {"type": "hello", "key": "w0", "nonce": os.urandom(16).hex(), "host": "h", "pid": 1,
                 "incarnation": "a", "resume": False}
        real, challenge, answer = _handshake((ch.host, ch.port), hello,
                                             lambda c: node_proof(secret, hello, c["nonce"]))
        assert answer == {"type": "welcome"}
        recorded = node_proof(secret, hello, challenge["nonce"])
        real.close()
        # An eavesdropper says the same hello and the same proof again.
        replayed, fresh, answer = _handshake((ch.host, ch.port), hello, lambda c: recorded)
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

            sock, _, answer = _handshake((ch.host, ch.port), hello, proof)
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
            conn.sendall(encode({"cmd": "head", "address": "10.9.9.9:6379"}))
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
