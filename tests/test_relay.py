"""Node links that end in the head's task (engine/link/relay.py): the driver only
dials out. Real supervisors (with the stand-in node of test_supervisor), a
real relay, a real channel and dialer, all on loopback."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator

import psutil
import pytest

from raydist.engine.link.channel import NodeChannel
from raydist.engine.link.keys import Frames, NodeKeys, relay_key, relay_proof
from raydist.engine.link.relay import LinkRelay, RelayDialer
from raydist.engine.link.wire import encode
from tests.test_supervisor import Recorder, _descendants, _living, _start_at

pytestmark = pytest.mark.component


@pytest.fixture
def relayed() -> Iterator[tuple[NodeChannel, LinkRelay, RelayDialer, Recorder, str]]:
    rec = Recorder()
    keys = NodeKeys()
    ch = NodeChannel("127.0.0.1", keys, rec)
    relay = LinkRelay("127.0.0.1", relay_key(keys.issue("head")))
    dialer = RelayDialer(("127.0.0.1", relay.port), relay_key(keys.issue("head")), ch.adopt)
    yield ch, relay, dialer, rec, keys.issue("w0")
    dialer.close()
    ch.close()
    relay.close()


def test_a_node_links_through_the_relay_and_stops_on_the_drivers_word(relayed) -> None:
    ch, relay, _, rec, secret = relayed
    sup = _start_at(("127.0.0.1", relay.port), secret, [])
    try:
        assert rec.wait("started"), rec.events
        tree = _descendants(sup.pid)
        assert ch.links()["w0"].pid == sup.pid  # the driver sees the supervisor itself, not the relay
        ch.stop_all()
        assert sup.wait(timeout=15) == 0
        assert rec.wait("stopped")
        assert not _living(tree)
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, 9)


def test_a_node_that_links_before_the_driver_dials_in_waits_for_it() -> None:
    rec = Recorder()
    keys = NodeKeys()
    ch = NodeChannel("127.0.0.1", keys, rec)
    relay = LinkRelay("127.0.0.1", relay_key(keys.issue("head")))
    sup = _start_at(("127.0.0.1", relay.port), keys.issue("w0"), [])
    try:
        time.sleep(1.5)  # the supervisor says hello to a relay nobody has dialled yet
        dialer = RelayDialer(("127.0.0.1", relay.port), relay_key(keys.issue("head")), ch.adopt)
        assert rec.wait("started"), rec.events
        ch.stop_all()
        assert sup.wait(timeout=15) == 0
        dialer.close()
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, 9)
        ch.close()
        relay.close()


def test_when_the_driver_is_gone_the_node_goes_after_its_grace(relayed) -> None:
    ch, relay, dialer, rec, secret = relayed
    sup = _start_at(("127.0.0.1", relay.port), secret, [], grace_s=3)
    try:
        assert rec.wait("started")
        tree = _descendants(sup.pid)
        dialer.close()
        ch.close()  # the driver is gone; the relay still listens, but nobody dials in
        sup.wait(timeout=20)
        assert not _living(tree)
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, 9)


def test_when_the_relay_is_gone_the_node_goes_at_once(relayed) -> None:
    ch, relay, _, rec, secret = relayed
    sup = _start_at(("127.0.0.1", relay.port), secret, [], grace_s=30)
    try:
        assert rec.wait("started")
        tree = _descendants(sup.pid)
        t0 = time.monotonic()
        relay.close()  # the head's task ended: nothing listens where the node links
        sup.wait(timeout=20)
        assert time.monotonic() - t0 < 15  # well inside the 30 s grace: refused, not silent
        assert not _living(tree)
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, 9)


def _read_all(sock: socket.socket) -> bytes:
    heard = b""
    while chunk := sock.recv(4096):
        heard += chunk
    return heard


def _proven_control(port: int, key: str) -> tuple[socket.socket, Frames]:
    """A control connection to the relay that proves its key, as the driver's does: its frames."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=5)
    mine = "2" * 32
    conn.sendall(encode({"type": "relay-control", "nonce": mine}))
    challenge = json.loads(conn.makefile("rb").readline())
    conn.sendall(encode({"type": "proof", "proof": relay_proof(key, "relay-control", challenge["nonce"])}))
    return conn, Frames.after_handshake(key, mine, challenge["nonce"], driver=True)


def test_the_control_connection_is_sealed_both_ways() -> None:
    """After the challenge every control line is a sealed frame: the relay's
    dials open under the driver's keys, and a line the driver did not seal
    (what a host on the path would inject) ends the connection."""
    key = relay_key(NodeKeys().issue("head"))
    relay = LinkRelay("127.0.0.1", key)
    try:
        conn, frames = _proven_control(relay.port, key)
        reader = conn.makefile("rb")
        node = socket.create_connection(("127.0.0.1", relay.port), timeout=5)
        node.sendall(encode({"type": "hello", "key": "w0"}))
        dial = json.loads(frames.open(reader.readline().rstrip(b"\n")))
        assert dial["type"] == "dial" and len(dial["id"]) == 16
        conn.sendall(encode({"type": "ping"}))  # unsealed
        assert _read_all(conn) == b""  # the relay dropped it
        node.close()
    finally:
        relay.close()


def test_the_dialer_obeys_no_line_its_relay_did_not_seal() -> None:
    """A stand-in relay that answers the challenge but then says ``dial`` in
    clear (an injector on the path): the driver dials nothing."""
    server = socket.create_server(("127.0.0.1", 0))
    dialled: list[str] = []
    dialer = RelayDialer(server.getsockname(), relay_key(NodeKeys().issue("head")),
                         lambda sock, source: dialled.append(source))
    try:
        server.settimeout(10)
        conn, _ = server.accept()
        lines = conn.makefile("rb")
        assert json.loads(lines.readline())["type"] == "relay-control"
        conn.sendall(encode({"type": "challenge", "nonce": "3" * 32}))
        assert json.loads(lines.readline())["type"] == "proof"
        conn.sendall(encode({"type": "dial", "id": "0" * 16}))
        conn.settimeout(10)
        assert conn.recv(100) == b""  # the driver closed the control connection...
        server.settimeout(0.5)
        until = time.monotonic() + 3
        while time.monotonic() < until:  # ...and opens no pair connection (new control ones, as it retries)
            try:
                extra, _ = server.accept()
            except TimeoutError:
                continue
            extra.settimeout(5)
            first = json.loads(extra.makefile("rb").readline() or b"{}")
            assert first.get("type") == "relay-control", first
            extra.close()
        assert dialled == []
    finally:
        dialer.close()
        server.close()


def test_the_relay_admits_no_driver_without_the_relays_key() -> None:
    key = relay_key(NodeKeys().issue("head"))
    relay = LinkRelay("127.0.0.1", key)
    try:
        stranger = socket.create_connection(("127.0.0.1", relay.port), timeout=5)
        stranger.sendall(encode({"type": "relay-control", "nonce": "1" * 32}))
        challenge = json.loads(stranger.recv(4096))
        assert challenge["type"] == "challenge"
        stranger.sendall(encode({"type": "proof", "proof": relay_proof("a-guess", "relay-control",
                                                                        challenge["nonce"])}))
        assert _read_all(stranger) == b""  # closed, and no dial ever reaches it
        # A proof recorded from the real driver's control connection opens no other: each has its nonce.
        replay = socket.create_connection(("127.0.0.1", relay.port), timeout=5)
        replay.sendall(encode({"type": "relay-control", "nonce": "1" * 32}))
        json.loads(replay.recv(4096))
        replay.sendall(encode({"type": "proof", "proof": relay_proof(key, "relay-control", challenge["nonce"])}))
        assert _read_all(replay) == b""
        node = socket.create_connection(("127.0.0.1", relay.port), timeout=5)
        node.sendall(encode({"type": "hello", "key": "w0"}))
        pair = socket.create_connection(("127.0.0.1", relay.port), timeout=5)
        guess = relay_proof("a-guess", "relay-pair", "0" * 16)
        pair.sendall(encode({"type": "relay-pair", "id": "0" * 16, "proof": guess}))
        assert pair.recv(100) == b""
        node.settimeout(8)
        assert node.recv(100) == b""  # nobody dialled its pair: dropped after the wait
    finally:
        relay.close()


def test_a_relay_closes_every_socket_it_held(relayed) -> None:
    ch, relay, _, rec, secret = relayed
    sup = _start_at(("127.0.0.1", relay.port), secret, [])
    try:
        assert rec.wait("started")
        ch.stop_all()
        assert sup.wait(timeout=15) == 0
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, 9)
    relay.close()
    time.sleep(0.5)
    mine = [c for c in psutil.Process().net_connections(kind="tcp")
            if c.laddr and c.laddr.port == relay.port and c.status != psutil.CONN_TIME_WAIT]
    assert not mine, json.dumps([str(c) for c in mine])


def test_a_crowd_of_silent_strangers_cannot_keep_a_node_off_the_relay(relayed) -> None:
    # Strangers on 127.0.0.2 take every place they may and say nothing; the
    # node (on 127.0.0.1) still links, and the strangers beyond their share
    # are closed at once.
    ch, relay, _, rec, secret = relayed
    crowd = []
    for _ in range(40):
        s = socket.socket()
        s.bind(("127.0.0.2", 0))
        s.connect(("127.0.0.1", relay.port))
        crowd.append(s)
    sup = None
    try:
        time.sleep(0.5)
        closed = 0
        for s in crowd:
            s.settimeout(0.05)
            try:
                closed += s.recv(1) == b""
            except TimeoutError:
                pass  # holds one of its address's places
        assert closed >= 40 - 8
        sup = _start_at(("127.0.0.1", relay.port), secret, [])
        assert rec.wait("started"), rec.events
        ch.stop_all()
        assert sup.wait(timeout=15) == 0
    finally:
        for s in crowd:
            s.close()
        if sup is not None and sup.poll() is None:
            os.killpg(sup.pid, 9)


def test_the_driver_counts_relayed_handshakes_by_the_address_they_came_from() -> None:
    # Strangers' hellos that reach the driver through the relay hold its
    # handshake places as direct ones do: MAX_PENDING_PER_SOURCE for one
    # address, and another address still gets its challenge.
    from raydist.engine.link.handshake import MAX_PENDING_PER_SOURCE

    rec = Recorder()
    keys = NodeKeys()
    keys.issue("head")
    ch = NodeChannel("127.0.0.1", keys, rec)
    far_ends = []
    try:
        def relayed_hello(source: str) -> socket.socket:
            ours, theirs = socket.socketpair()
            theirs.sendall(encode({"type": "hello", "key": "head", "nonce": os.urandom(16).hex()}))
            ch.adopt(ours, source)
            far_ends.append(theirs)
            return theirs

        crowd = [relayed_hello("relay:10.9.9.9") for _ in range(MAX_PENDING_PER_SOURCE + 12)]
        other = relayed_hello("relay:10.9.9.7")

        def answered(sock: socket.socket) -> bool:
            sock.settimeout(2)
            try:
                return json.loads(sock.makefile("rb").readline() or b"{}").get("type") == "challenge"
            except (OSError, ValueError):
                return False

        assert sum(answered(s) for s in crowd) == MAX_PENDING_PER_SOURCE
        assert answered(other)
    finally:
        for s in far_ends:
            s.close()
        ch.close()


def test_the_relay_tells_the_driver_where_a_node_connected_from(relayed) -> None:
    ch, relay, dialer, rec, secret = relayed
    sources: list[str] = []
    adopt = dialer._adopt
    dialer._adopt = lambda conn, source: (sources.append(source), adopt(conn, source))  # type: ignore[method-assign]
    sup = _start_at(("127.0.0.1", relay.port), secret, [])
    try:
        assert rec.wait("started"), rec.events
        assert sources and set(sources) == {"relay:127.0.0.1"}, sources
        ch.stop_all()
        assert sup.wait(timeout=15) == 0
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, 9)
