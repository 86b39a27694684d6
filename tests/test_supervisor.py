"""The node supervisor on its own: no process it started outlives it.

A stand-in command tree (bash with sleeping children, one of which escapes its
parent) plays the Ray node; the supervisor and the channel are the real ones.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from raydist.engine.link.channel import NodeChannel, NodeLink
from raydist.engine.link.handshake import MAX_PENDING, MAX_PENDING_PER_SOURCE
from raydist.engine.link.keys import NodeKeys, say_hello
from raydist.engine.link.wire import LineReader
from raydist.engine.node.reaper import started_at

pytestmark = pytest.mark.component

TREE = (
    "(sleep 300 &) ; "  # an orphaned grandchild, reparented to the subreaper
    "sleep 300 & "
    "echo 'Ray runtime started.'; wait"
)


def _start(channel: NodeChannel, secret: str, watch: list[psutil.Process],
           temp_dir: str = "") -> subprocess.Popen[bytes]:
    return _start_at((channel.host, channel.port), secret, watch, temp_dir)


def _start_at(address: tuple[str, int], secret: str, watch: list[psutil.Process], temp_dir: str = "",
              **link: float) -> subprocess.Popen[bytes]:
    """A real supervisor whose node is the stand-in tree, linked to ``address``;
    ``link`` overrides the link's timers (``idle_s``, ``heartbeat_s``, ``grace_s``)."""
    cfg = {
        "temp_dir": temp_dir,
        "key": "w0",
        "channel": list(address),
        "node_secret": secret,
        "argv": ["bash", "-c", TREE],
        "env": {},
        "watch": [[p.pid, started_at(p.pid)] for p in watch],
        "wait_for": "",
        "deadline_s": 30,
        **link,
    }
    # The stand-in takes none of the port flags a real `ray start` gets.
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from raydist.engine.node import supervisor as s; "
         "s.NODE_PORT_OPTIONS = (); sys.exit(s.main())"],
        stdin=subprocess.PIPE, start_new_session=True,
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(cfg).encode())
    proc.stdin.close()
    return proc


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.cond = threading.Condition()

    def __call__(self, event: str, link: NodeLink) -> None:
        with self.cond:
            self.events.append((event, link.key))
            self.cond.notify_all()

    def wait(self, event: str, timeout: float = 20) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while (event, "w0") not in self.events:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


@pytest.fixture
def channel() -> tuple[NodeChannel, Recorder, str]:
    rec = Recorder()
    keys = NodeKeys()
    ch = NodeChannel("127.0.0.1", keys, rec)
    yield ch, rec, keys.issue("w0")
    ch.close()


def test_stop_from_driver_kills_the_whole_tree_and_removes_the_temp_dir(channel, tmp_path) -> None:
    ch, rec, secret = channel
    node_dir = tmp_path / "raydist-node"
    (node_dir / "session_latest" / "logs").mkdir(parents=True)
    sup = _start(ch, secret, [], str(node_dir))
    assert rec.wait("started")
    tree = _descendants(sup.pid)
    assert len(tree) >= 3, tree
    ch.stop_all()
    assert sup.wait(timeout=15) == 0
    assert rec.wait("stopped")
    assert ch.links()["w0"].ended_why() == "stopped by the driver"  # what an error about the node says
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not node_dir.exists()  # the node's Ray session goes with it


def test_death_of_watched_process_kills_the_tree(channel) -> None:
    ch, rec, secret = channel
    stand_in = subprocess.Popen(["sleep", "300"])  # plays the Spark task's Python worker
    sup = _start(ch, secret, [psutil.Process(stand_in.pid)])
    assert rec.wait("started")
    tree = _descendants(sup.pid)
    stand_in.kill()
    stand_in.wait()
    sup.wait(timeout=15)
    assert rec.wait("closed")
    assert f"watched process {stand_in.pid} died" in ch.links()["w0"].ended_why()
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a_watched_process_stays_alive_when_the_wall_clock_moves(monkeypatch) -> None:
    """Linux gives the boot time in whole seconds, derived from the wall
    clock: a clock step or NTP's slewing moves it by a second under a live
    process. A node that took that for its Spark task's death stopped at
    random (a head at start, a worker mid-run, its driver with it)."""
    from psutil import _pslinux

    from raydist.engine.node.reaper import watched_alive

    stand_in = subprocess.Popen(["sleep", "300"])
    try:
        started = started_at(stand_in.pid)
        assert watched_alive(stand_in.pid, started)
        booted = _pslinux.boot_time()
        monkeypatch.setattr(_pslinux, "boot_time", lambda: booted + 1.0)  # the clock stepped
        assert watched_alive(stand_in.pid, started)
        assert not watched_alive(stand_in.pid, started - 0.5)  # another process given the same pid
    finally:
        stand_in.kill()
        stand_in.wait()
    assert not watched_alive(stand_in.pid, started)


def test_lost_driver_link_kills_the_tree(channel) -> None:
    ch, rec, secret = channel
    sup = _start(ch, secret, [])
    assert rec.wait("started")
    tree = _descendants(sup.pid)
    ch.close()  # the driver is gone
    sup.wait(timeout=15)
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a_wrong_node_key_is_refused(channel) -> None:
    ch, rec, _ = channel
    sup = _start(ch, NodeKeys().issue("w0"), [])  # w0's key, but of another cluster
    # Neither side can prove the key to the other: the supervisor gives up at
    # once with its error code (no retry makes a wrong key right), and the
    # driver never takes it as node w0.
    assert sup.wait(timeout=15) == 2
    assert ("hello", "w0") not in rec.events and "w0" not in ch.links()


# --- the link under faults: blips, silence, strangers ---------------------------------


class Proxy:
    """A TCP forwarder that can go silent: while ``blackhole`` is set it reads and
    drops everything both ways, as a network that loses packets would."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.blackhole = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                conn.close()
                continue
            self.socks += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                if not self.blackhole.is_set():
                    dst.sendall(chunk)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.server.close()
        for s in self.socks:
            s.close()


def _living(tree: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture
def short_link() -> tuple[NodeChannel, Recorder, str, Proxy]:
    """A channel with short link timers (silence 1.5 s, grace 8 s) behind a proxy."""
    rec = Recorder()
    keys = NodeKeys()
    ch = NodeChannel("127.0.0.1", keys, rec, idle_s=1.5, grace_s=8)
    proxy = Proxy((ch.host, ch.port))
    yield ch, rec, keys.issue("w0"), proxy
    proxy.close()
    ch.close()


def test_a_blip_shorter_than_the_grace_window_keeps_the_node(short_link) -> None:
    ch, rec, secret, proxy = short_link
    sup = _start_at(("127.0.0.1", proxy.port), secret, [], idle_s=1.5, heartbeat_s=0.3, grace_s=8)
    try:
        assert rec.wait("started")
        tree = _descendants(sup.pid)
        proxy.blackhole.set()  # both ends go silent past their idle bound
        time.sleep(4)
        proxy.blackhole.clear()
        time.sleep(3)  # the supervisor reconnects through the proxy
        link = ch.links().get("w0")
        assert sup.poll() is None, (  # what each end said, for a failure seen once on a loaded machine
            f"the supervisor gave up its node during a short blip: events {rec.events}, "
            f"node's last lines {list(link.log_tail)[-10:] if link is not None else None}")
        assert len(_living(tree)) == len(tree)
        assert ("closed", "w0") not in rec.events
        assert [e for e in rec.events if e[0] == "hello"] == [("hello", "w0")]  # resumed, not a new node
        ch.stop_all()  # the resumed link still carries the driver's word
        assert sup.wait(timeout=15) == 0
        assert not _living(tree)
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, 9)


def test_a_hello_lost_in_a_blip_is_retried_not_taken_for_a_refusal() -> None:
    # The driver's handshake timer (1 s here) closes a reconnect whose hello the
    # blip swallowed before the supervisor's own timer fires: that close is not
    # a "no", and the node must survive it (seen once in CI as a lost node).
    rec = Recorder()
    keys = NodeKeys()
    secret = keys.issue("w0")
    ch = NodeChannel("127.0.0.1", keys, rec, idle_s=1.5, grace_s=10, handshake_s=1.0)
    proxy = Proxy((ch.host, ch.port))
    sup = _start_at(("127.0.0.1", proxy.port), secret, [], idle_s=1.5, heartbeat_s=0.3, grace_s=10)
    try:
        assert rec.wait("started")
        proxy.blackhole.set()
        time.sleep(4.5)  # at least one reconnect's hello is lost and closed by the driver
        proxy.blackhole.clear()
        resumed = "raydist: link to the driver resumed"
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and resumed not in list(ch.links()["w0"].log_tail):
            assert sup.poll() is None, f"the node was stopped by a lost hello: events {rec.events}"
            time.sleep(0.2)
        assert resumed in list(ch.links()["w0"].log_tail)
        assert ("closed", "w0") not in rec.events
        ch.stop_all()
        assert sup.wait(timeout=15) == 0
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, 9)
        proxy.close()
        ch.close()


def test_a_handshake_the_node_gave_up_on_after_the_driver_took_it_costs_no_node() -> None:
    # A supervisor whose wait for its welcome timed out (a loaded host) closes
    # that connection and says hello again, as the same process; the driver
    # had taken the first one already. Its close is not the node's end, and the
    # second hello is the same node, not a new one: a cluster whose head did
    # this failed with "the head node stopped" while the head ran.
    rec = Recorder()
    keys = NodeKeys()
    ch = NodeChannel("127.0.0.1", keys, rec)
    first = socket.create_connection((ch.host, ch.port))
    second = socket.create_connection((ch.host, ch.port))
    try:
        say_hello(first, "w0", keys.issue("w0"), incarnation="same")
        assert rec.wait("hello")
        first.close()
        time.sleep(0.5)  # the driver reads the close before the next hello
        _, rest, frames = say_hello(second, "w0", keys.issue("w0"), incarnation="same")
        time.sleep(1.0)
        assert rec.events == [("hello", "w0"), ("resumed", "w0")], rec.events
        assert not ch.links()["w0"].closed.is_set()
        ch.links()["w0"].stop()  # what the driver says reaches the connection the node uses
        reader = LineReader(second, idle_s=5, initial=rest, frames=frames)
        assert reader.read() == {"type": "stop"}
        second.close()  # a close that is not followed by a hello is the node's end, after a moment
        assert rec.wait("closed", timeout=15)
    finally:
        first.close()
        second.close()
        ch.close()


def test_a_link_broken_past_the_grace_window_stops_the_node(short_link) -> None:
    ch, rec, secret, proxy = short_link
    sup = _start_at(("127.0.0.1", proxy.port), secret, [], idle_s=1.5, heartbeat_s=0.3, grace_s=3)
    try:
        assert rec.wait("started")
        tree = _descendants(sup.pid)
        proxy.blackhole.set()
        sup.wait(timeout=20)  # silence 1.5 s, then 3 s of failed reconnects
        assert not _living(tree)
        assert rec.wait("closed", timeout=20)  # and the driver calls it lost after its own grace
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, 9)


def test_a_sigkilled_supervisor_leaves_no_process_and_no_temp_dir(channel, tmp_path) -> None:
    ch, rec, secret = channel
    node_dir = tmp_path / "raydist-node"
    node_dir.mkdir()
    sup = _start(ch, secret, [], str(node_dir))
    assert rec.wait("started")
    tree = _descendants(sup.pid)
    assert len(tree) >= 3, tree
    os.kill(sup.pid, 9)  # nothing in the supervisor runs now
    sup.wait()
    deadline = time.monotonic() + 10
    while _living(tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _living(tree), [p.cmdline() for p in _living(tree)]
    while node_dir.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not node_dir.exists()


def test_strangers_cost_no_thread_and_cannot_block_the_channel() -> None:
    rec = Recorder()
    keys = NodeKeys()
    secret = keys.issue("w0")
    ch = NodeChannel("127.0.0.1", keys, rec, handshake_s=1.0)
    threads_before = threading.active_count()
    strangers = [socket.create_connection((ch.host, ch.port)) for _ in range(100)]
    sup = None
    try:
        for i, s in enumerate(strangers):
            try:
                if i % 3 == 0:
                    s.sendall(b"x" * 10_000)  # an endless first line
                elif i % 3 == 1:
                    s.sendall(b'{"type": "hello", "key": "w0", "nonce": "' + b"0" * 32 + b'"}\n')  # no proof follows
                # the rest say nothing at all
            except OSError:
                pass  # the channel may have dropped it already, mid-send
        time.sleep(0.5)
        assert threading.active_count() <= threads_before + 1
        sup = _start(ch, secret, [])  # a real node still gets in, while strangers hang on
        assert rec.wait("started")
        time.sleep(1.5)  # past the handshake bound every stranger has been dropped
        challenged = 0
        for i, s in enumerate(strangers):
            s.settimeout(2)
            heard = b""
            try:
                while chunk := s.recv(4096):  # a timeout here means a stranger still holds on
                    heard += chunk
            except ConnectionResetError:
                pass
            # Each is dropped. One that said hello, among the first
            # MAX_PENDING_PER_SOURCE from this address, hears one challenge
            # and, with no proof, nothing more; one past that cap is closed
            # unanswered; the rest hear nothing at all.
            if i % 3 == 1 and heard:
                challenged += 1
                assert heard.startswith(b'{"type":"challenge"') and heard.count(b"\n") == 1, (i, heard)
            else:
                assert heard == b"", (i, heard)
        assert 1 <= challenged <= MAX_PENDING_PER_SOURCE, challenged
        assert ("hello", "w0") in rec.events and len([e for e in rec.events if e[0] == "hello"]) == 1
    finally:
        for s in strangers:
            s.close()
        ch.close()
        if sup is not None:
            sup.wait(timeout=15)


def test_a_key_the_cluster_never_issues_is_refused(channel) -> None:
    # A node's key names its log directory at teardown: "../../x" must never get that far.
    ch, rec, secret = channel
    sup = _start_at((ch.host, ch.port), secret, [], key="../../x")
    sup.wait(timeout=15)
    assert not [e for e in rec.events if e[0] == "hello"]
    for key in ("w0/../../x", "w7"):  # a path, and a well-formed key this cluster never issued
        with socket.create_connection((ch.host, ch.port)) as s:
            s.sendall(json.dumps({"type": "hello", "key": key, "nonce": "0" * 32}).encode() + b"\n")
            s.settimeout(5)
            assert s.recv(4096) == b'{"type":"refused"}\n'
    assert not [e for e in rec.events if e[0] == "hello"]


def test_a_flood_of_strangers_from_another_host_cannot_push_out_a_slow_hello() -> None:
    # Strangers on 127.0.0.2 connect as fast as they can and say nothing; a
    # real node on 127.0.0.1 takes a second to say hello. It must be heard
    # (before, each new stranger pushed the oldest waiting hello out).
    rec = Recorder()
    keys = NodeKeys()
    secret = keys.issue("w0")
    ch = NodeChannel("127.0.0.1", keys, rec, handshake_s=3.0)
    stop = threading.Event()
    made = [0]

    def flood() -> None:
        held: list[socket.socket] = []
        while not stop.is_set():
            s = socket.socket()
            try:
                s.bind(("127.0.0.2", 0))
                s.connect((ch.host, ch.port))
                made[0] += 1
            except OSError:
                s.close()
                continue
            held.append(s)
            if len(held) > 300:
                held.pop(0).close()
        for s in held:
            s.close()

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        time.sleep(0.5)
        with socket.create_connection((ch.host, ch.port)) as real:
            before = made[0]
            time.sleep(1.0)  # a slow hello, while the flood goes on
            during = made[0] - before
            say_hello(real, "w0", secret, host="h", pid=1, incarnation="i", resume=False)
            heard = rec.wait("hello", timeout=5)
        assert during > MAX_PENDING  # more strangers came meanwhile than the channel holds waiting
        assert heard
    finally:
        stop.set()
        flooder.join(10)
        ch.close()


def test_channels_listen_within_the_link_ports_and_say_when_they_are_all_taken() -> None:
    from raydist.engine.ports import free_port
    from raydist.errors import LinkPortsInUseError

    low = free_port("127.0.0.1")
    while low > 65000 or 10002 <= low <= 19999:
        low = free_port("127.0.0.1")
    rec = Recorder()
    first = NodeChannel("127.0.0.1", NodeKeys(), rec, ports=(low, low + 1))
    try:
        second = NodeChannel("127.0.0.1", NodeKeys(), rec, ports=(low, low + 1))
        try:
            assert {first.port, second.port} == {low, low + 1}
            with pytest.raises(LinkPortsInUseError, match=f"server.link_ports \\({low}-{low + 1}\\)"):
                NodeChannel("127.0.0.1", NodeKeys(), rec, ports=(low, low + 1))
        finally:
            second.close()
    finally:
        first.close()


def test_an_endless_line_from_a_node_breaks_only_its_link() -> None:
    rec = Recorder()
    keys = NodeKeys()
    ch = NodeChannel("127.0.0.1", keys, rec, grace_s=0.5)
    try:
        s = socket.create_connection((ch.host, ch.port))
        say_hello(s, "w0", keys.issue("w0"), incarnation="a")
        assert rec.wait("hello")
        s.sendall(b'{"type": "log", "line": "' + b"y" * 200_000)
        assert rec.wait("closed", timeout=10)
        assert "a line longer than" in ch.links()["w0"].ended_why()
        s.close()
    finally:
        ch.close()


def test_ports_the_supervisor_picks_never_repeat_one_the_plan_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver picks a head's GCS, client and dashboard ports, the
    supervisor the node's others, each in its own process: a port picked
    twice made `ray start` fail ("is trying to use a port number ... that is
    used by other components"). Here the picker is made to offer the
    dashboard's port every time."""
    import raydist.engine.ports as ports
    from raydist.engine.node.supervisor import NODE_PORT_OPTIONS, Supervisor, ports_named

    named = ports._quiet_ports()[0] if ports._quiet_ports() else 23456
    monkeypatch.setattr(ports.random, "choice", lambda seq: named)
    argv = Supervisor({"argv": ["ray", "start", f"--dashboard-port={named}", "--port=6379"]}).argv()
    picked = [int(a.split("=", 1)[1]) for a in argv if any(a.startswith(f"--{o}=") for o in NODE_PORT_OPTIONS)]
    assert len(picked) == len(NODE_PORT_OPTIONS)
    assert named not in picked and 6379 not in picked and len(set(picked)) == len(picked)
    assert ports_named(argv) == {named, 6379, *picked}


def test_saying_something_to_a_node_that_stops_reading_never_blocks() -> None:
    # The cluster told nodes things under its lock with a blocking send: one
    # stuck peer (its socket buffer full) stalled every status call. A send
    # now queues; a peer that reads nothing is dropped past a bound.
    rec = Recorder()
    keys = NodeKeys()
    ch = NodeChannel("127.0.0.1", keys, rec, grace_s=1.0)
    s = socket.create_connection((ch.host, ch.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        say_hello(s, "w0", keys.issue("w0"), incarnation="a")
        assert rec.wait("hello")
        link = ch.links()["w0"]
        big = {"type": "head", "address": "x" * 60_000}
        slowest = 0.0
        for _ in range(200):  # 12 MB to a peer that reads none of it
            t = time.monotonic()
            link.tell(big)
            slowest = max(slowest, time.monotonic() - t)
        assert slowest < 0.2, f"a send blocked for {slowest:.2f} s"
        assert rec.wait("closed", timeout=15), "a peer that reads nothing was kept forever"
    finally:
        s.close()
        ch.close()


def test_one_thread_serves_every_link() -> None:
    rec = Recorder()
    keys = NodeKeys()
    ch = NodeChannel("127.0.0.1", keys, rec)
    before = threading.active_count()
    socks = []
    framed = []
    try:
        for i in range(50):
            s = socket.create_connection((ch.host, ch.port))
            framed.append(say_hello(s, f"w{i}", keys.issue(f"w{i}"), incarnation=str(i)))
            socks.append(s)
        deadline = time.monotonic() + 10
        while len(ch.links()) < 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(ch.links()) == 50
        assert threading.active_count() == before  # no thread per link
        _, rest, frames = framed[7]
        socks[7].sendall(frames.seal(b'{"type": "ping"}\n'))
        assert LineReader(socks[7], idle_s=5, initial=rest, frames=frames).read() == {"type": "pong"}
    finally:
        for s in socks:
            s.close()
        ch.close()


_EMFILE_PROGRAM = """
import os, resource, sys, time
import psutil
from raydist.engine.link.channel import NodeChannel
from raydist.engine.link.keys import NodeKeys
keys = NodeKeys()
ch = NodeChannel("127.0.0.1", keys, lambda event, link: None)
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (psutil.Process().num_fds() + 4, hard))
print(ch.port, keys.issue("w0"), flush=True)
sys.stdin.readline()  # the connections are made: measure the channel's CPU while it cannot accept
t = time.process_time()  # no file to open: there is none to spare
time.sleep(2.0)
print(round(time.process_time() - t, 3), flush=True)
sys.stdin.readline()  # the connections are gone: a node can link again
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
deadline = time.monotonic() + 15
while "w0" not in ch.links() and time.monotonic() < deadline:
    time.sleep(0.1)
print("linked" if "w0" in ch.links() else "not linked", flush=True)
"""


def test_out_of_file_descriptors_the_channel_backs_off_instead_of_spinning() -> None:
    # accept() failing with EMFILE left the listener readable and the loop
    # went round it as fast as it could (a core spent doing nothing).
    proc = subprocess.Popen([sys.executable, "-c", _EMFILE_PROGRAM], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdin is not None and proc.stdout is not None
    conns = []
    try:
        port, secret = proc.stdout.readline().split()
        for _ in range(30):
            conns.append(socket.create_connection(("127.0.0.1", int(port))))
        proc.stdin.write("go\n")
        proc.stdin.flush()
        cpu = float(proc.stdout.readline())
        assert cpu < 0.5, f"the channel spent {cpu} s of CPU in 2 s while it could not accept"
        for c in conns:
            c.close()
        conns = []
        proc.stdin.write("go\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 15
        while True:  # as a supervisor does: the channel takes it once its pause ends
            s = socket.create_connection(("127.0.0.1", int(port)))
            conns.append(s)
            try:
                say_hello(s, "w0", secret, incarnation="a")
                break
            except Exception:
                assert time.monotonic() < deadline
        assert proc.stdout.readline().strip() == "linked"
    finally:
        for c in conns:
            c.close()
        proc.kill()
        proc.wait()
