"""The node supervisor on its own: no process it started outlives it.

A stand-in command tree (bash with sleeping children, one of which escapes its
parent) plays the Ray node; the supervisor and the channel are the real ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import psutil
import pytest

from raydist.engine.channel import NodeChannel, NodeLink

TREE = (
    "(sleep 300 &) ; "  # an orphaned grandchild, reparented to the subreaper
    "sleep 300 & "
    "echo 'Ray runtime started.'; wait"
)


def _start(
    channel: NodeChannel, secret: str, watch: list[psutil.Process], temp_dir: str = ""
) -> subprocess.Popen[bytes]:
    cfg = {
        "temp_dir": temp_dir,
        "key": "w0",
        "channel": [channel.host, channel.port],
        "secret": secret,
        "argv": ["bash", "-c", TREE],
        "env": {},
        "watch": [[p.pid, p.create_time()] for p in watch],
        "wait_for": "",
        "deadline_s": 30,
    }
    # The stand-in takes none of the port flags a real `ray start` gets.
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from raydist.engine import supervisor as s; "
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
    secret = os.urandom(8).hex()
    ch = NodeChannel("127.0.0.1", secret, rec)
    yield ch, rec, secret
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
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_lost_driver_link_kills_the_tree(channel) -> None:
    ch, rec, secret = channel
    sup = _start(ch, secret, [])
    assert rec.wait("started")
    tree = _descendants(sup.pid)
    ch.close()  # the driver is gone
    sup.wait(timeout=15)
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_wrong_secret_is_refused(channel) -> None:
    ch, rec, _ = channel
    sup = _start(ch, "not-the-secret", [])
    sup.wait(timeout=15)
    assert ("hello", "w0") not in rec.events
