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


def _welcomed(ch: NodeChannel, key: str, secret: str, **fields: object) -> socket.socket:
    hello = {"type": "hello", "key": key, "nonce": os.urandom(16).hex(), "host": "h", "pid": 7,
             "incarnation": os.urandom(4).hex(), "resume": False, **fields}
    sock, _, answer = _handshake((ch.host, ch.port), hello, lambda c: node_proof(secret, hello, c["nonce"]))
    assert answer == {"type": "welcome"}, (fields, answer)
    return sock


def _ended(sock: socket.socket) -> bool:
    """The driver closed ``sock``: it reads to the end (what it said first aside)."""
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
    # buggy) sends frames raydist cannot use: each ends that connection, and
    # every other node's link, and the channel, carry on.
    rec = Recorder()
    keys = NodeKeys()
    bystander_secret = keys.issue("w1")
    secret = keys.issue("w0")
    ch = NodeChannel("127.0.0.1", keys, rec)
    try:
        bystander = _welcomed(ch, "w1", bystander_secret)
        bad_hello = _handshake((ch.host, ch.port), h := {"type": "hello", "key": "w0", "pid": "x", "host": {"a": 1},
                                                          "nonce": os.urandom(16).hex(), "incarnation": "i"},
                               lambda c: node_proof(secret, h, c["nonce"]))[0]
        bad_hello.close()
        frames = [
            {"type": "stopped", "log_tail": 1, "code": "x"},
            {"type": "started", "info": [1, 2], "node_ip": None},
            b"[" * 200_000,  # nested past Python's recursion limit
        ]
        for frame in frames:
            sock = _welcomed(ch, "w0", secret)
            sock.sendall(frame + b"\n" if isinstance(frame, bytes) else encode(frame))
            if isinstance(frame, bytes):
                assert _ended(sock)  # not a JSON object: its connection ends
            sock.close()
        # A log reply that is not one: a size that is no number, data that is no base64.
        for reply in ({"size": "x", "data": ""}, {"size": 3, "data": "*not base64*"}):
            sock = _welcomed(ch, "w0", secret)
            link = ch.links()["w0"]
            request = link.ask_logs(max_bytes=10)
            asked = _line(sock)
            assert asked["cmd"] == "logs", asked
            sock.sendall(encode({"type": "logs", "req": asked["req"], "name": "raylet.out", **reply}))
            assert _ended(sock), reply
            request.forget()
        # The bystander's link is whole: it is still heard and answered.
        bystander.sendall(encode({"type": "ping"}))
        bystander.settimeout(10)
        assert _line(bystander) == {"type": "pong"}
        assert not ch.links()["w1"].closed.is_set()
        # ... and the channel takes new nodes.
        again = _welcomed(ch, "w0", secret)
        again.sendall(encode({"type": "ping"}))
        assert _line(again) == {"type": "pong"}
        again.close()
        bystander.close()
    finally:
        ch.close()


def test_a_node_sends_no_more_logs_than_were_asked_for() -> None:
    rec = Recorder()
    keys = NodeKeys()
    secret = keys.issue("w0")
    ch = NodeChannel("127.0.0.1", keys, rec)
    try:
        sock = _welcomed(ch, "w0", secret)
        request = ch.links()["w0"].ask_logs(max_bytes=1000)
        asked = _line(sock)
        import base64

        chunk = base64.b64encode(b"x" * 600).decode()
        for i in range(50):  # 30 KB against the 1,000 bytes asked for
            sock.sendall(encode({"type": "logs", "req": asked["req"], "name": f"f{i}", "size": 600, "data": chunk}))
        files = request.wait(10)  # answered with what fits, without waiting for a "done"
        assert sum(len(data) for _, _, data in files) <= 1000
        assert [name for name, _, _ in files] == ["f0"]
        sock.close()
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
        stale.settimeout(10)
        heard = []
        try:
            for _ in range(50):  # the old one goes on pinging, as a wedged supervisor would
                stale.sendall(encode({"type": "ping"}))
                line = _line(stale)
                if not line:
                    break
                heard.append(line)
        except OSError:
            pass
        assert {"cmd": "stop"} in heard and len(heard) < 50, heard
        fresh.sendall(encode({"type": "ping"}))
        fresh.settimeout(10)
        assert _line(fresh) == {"type": "pong"}  # the new one is the node's link
        assert ch.links()["w0"].incarnation != ""
        fresh.close()
        stale.close()
    finally:
        ch.close()
