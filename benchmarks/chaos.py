"""Chaos: a real `raydist serve` under faults, read load and churn; does its state ever lie?

Starts `raydist serve` (its own RAYDIST_HOME, an embedded local-cluster) and for
--seconds runs, all at once:

* --clients readers, one real `Client` (own channel) each, calling GetCluster,
  ListClusters and WatchCluster (first event) in a loop, retrying UNAVAILABLE
  as the real client does (a server restart is covered by its retry window);
* a loop that creates small clusters (1 worker), waits for them, keeps them a
  few seconds and deletes them, with `restart_on_server_restart` on every other;
* a fault every ~--fault-every seconds, chosen at random from those that find a
  target: SIGKILL an executor JVM, a node supervisor, a raylet, a head's GCS, or
  the server itself, started again at once on the same RAYDIST_HOME; and
  in each round, in turn, one of: the server started while another process holds its
  SQLite database locked (it must refuse, naming the file, then start once the
  lock is gone: a refusal that did not name it, or a start, is a lying state),
  a cluster deleted while it starts, or a cluster that asks to come back
  deleted while a restarted server reconciles it;
* a monitor that compares, every second, each row the server reports with the
  processes on this host: a RUNNING/DEGRADED row whose GCS is gone, or a
  DELETED/FAILED row whose Ray processes still run, is a contradiction; one that
  lasts more than 10 s is a lying state.

The readers and the churn are tenant ``alice``; all the while, the attackers
of benchmarks/hostile.py (tenant ``mallory``, strangers at the node-link
ports, an eavesdropper replaying a handshake, senders to a data agent) try
to reach what is not theirs.

At the end every cluster is deleted, the server stopped, and the store checked
against every cluster ever created (a cluster missing from it is lost) and the
host against Ray processes left (orphans). Last line:

  faults=<n> lost_clusters=<n> lying_states=<n> orphans=<n> read_errors=<n> p99_ms=<reads under chaos>
  hostile=<attempts> breaches=<n>

Target: faults >= 10, hostile >= 3000, all the others 0.

Run: .venv/bin/python benchmarks/chaos.py [--seconds 60] [--clients 64] [--seed 1]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.hostile import Hostile  # noqa: E402
from raydist.control.client import Client  # noqa: E402
from raydist.engine.node.procs import ray_processes  # noqa: E402
from raydist.engine.ports import free_port  # noqa: E402
from raydist.errors import RPCError  # noqa: E402
from raydist.spec import ClusterSpec  # noqa: E402

LIE_AFTER_S = 10.0
#: Each reader's pause between calls (64 readers: up to ~600 reads/s, leaving this
#: 2-core machine room to start the clusters the faults need).
THINK_S = 0.1
#: Create/delete loops at once: a cluster is up for the faults most of the time.
CHURN_LOOPS = 2
TERMINAL = {"DELETED", "FAILED"}
#: Faults that are a sequence of steps of their own (Chaos._<name>), not a SIGKILL.
_STORY_FAULTS = ("locked-store", "delete-during-create", "delete-during-restart")
ALIVE = {"RUNNING", "DEGRADED"}


class Server:
    """The `raydist serve` subprocess, restartable on the same home."""

    def __init__(self, home: Path, port: int, master: str) -> None:
        self.home, self.port, self.master = home, port, master
        self.address = f"127.0.0.1:{port}"
        self.env = {**os.environ, "RAYDIST_HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0"}
        for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_MODE", "RAYDIST_TOKEN"):
            self.env.pop(key, None)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = open(home / "server.log", "ab")  # noqa: SIM115 - closed at the end

    def start(self) -> None:
        info = self.home / "server.json"
        info.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "raydist.cli", "serve", "--port", str(self.port), "--spark-master", self.master,
             "--metrics-port", "-1", "--config", str(self.home / "raydist.toml")],
            env=self.env, stdout=self.log, stderr=self.log, start_new_session=True, cwd=ROOT,
        )
        deadline = time.monotonic() + 60
        while not info.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server did not start; see " + str(self.home / "server.log"))
            time.sleep(0.05)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def token(self) -> str:
        return (self.home / "control_token").read_text().strip()

    def tenant_token(self, name: str) -> str:
        return (self.home / f"{name}.token").read_text().strip()

    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=120)
        finally:
            self.log.close()


def _targets(root: int, kind: str) -> list[psutil.Process]:
    """Processes of ``kind`` that the current server started (its process
    tree: executors, supervisors and their Ray nodes); nothing else here is
    ever signalled."""
    try:
        tree = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for proc in tree:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            argv = proc.cmdline()
            if kind == "executor":
                hit = proc.name() == "java" and any("CoarseGrainedExecutorBackend" in a for a in argv)
            elif kind == "supervisor":
                hit = "raydist.engine.node.supervisor" in argv and os.getsid(proc.pid) == proc.pid
            else:
                hit = proc.name() == {"raylet": "raylet", "gcs": "gcs_server"}[kind]
        except (psutil.Error, OSError):
            continue
        if hit:
            found.append(proc)
    return found


def _cluster_processes(address: str) -> list[psutil.Process]:
    """Ray processes of the cluster whose GCS is ``address`` (host:port)."""
    port = address.rsplit(":", 1)[-1]
    marks = (f"--gcs_server_port={port}", f"--gcs-address={address}", f"--address={address}")
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(m in a for a in proc.info["cmdline"] or () for m in marks):
                found.append(proc)
        except psutil.Error:
            continue
    return found


class Chaos:
    def __init__(self, server: Server, args: argparse.Namespace) -> None:
        self.server = server
        self.args = args
        self.rng = random.Random(args.seed)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.read_errors: list[str] = []
        self.created: set[str] = set()
        self.faults: list[str] = []
        self.lies: list[str] = []
        self.names = [f"c{loop}-{i}" for loop in range(CHURN_LOOPS) for i in range(3)]
        self.restarting = threading.Event()
        self.round: list[str] = []
        self._rounds = 0

    def client(self, *, admin: bool = False) -> Client:
        """Tenant alice's client (the readers', the churn's); ``admin``: the server's own token."""
        token = self.server.token() if admin else self.server.tenant_token("alice")
        return Client(self.server.address, token=token, timeout=10, retry_s=60)

    # -- readers -------------------------------------------------------------

    def reader(self, seed: int) -> None:
        rng = random.Random(seed)
        client = self.client()
        while not self.stop.is_set():
            what = rng.choice(("get", "list", "watch"))
            name = rng.choice(self.names)
            start = time.perf_counter()
            try:
                if what == "get":
                    client.get(name)
                elif what == "list":
                    client.list()
                else:
                    next(iter(client.watch(name, timeout=5)), None)
            except RPCError as exc:
                if exc.code != "NOT_FOUND":  # a name not created yet, or never: a valid answer
                    with self.lock:
                        self.read_errors.append(f"{what}: {exc}")
                    continue
            except Exception as exc:  # noqa: BLE001 - every other failure is a read error
                with self.lock:
                    self.read_errors.append(f"{what}: {exc!r}"[:300])
                continue
            with self.lock:
                self.latencies.append(time.perf_counter() - start)
            self.stop.wait(THINK_S)
        client.close()

    # -- churn ---------------------------------------------------------------

    def churn(self, loop: int) -> None:
        client = self.client()
        names = [n for n in self.names if n.startswith(f"c{loop}-")]
        i = 0
        while not self.stop.is_set():
            name = names[i % len(names)]
            i += 1
            try:
                t0 = time.monotonic()
                client.create(ClusterSpec(name=name, workers=1, cpus_per_worker=1), request_id=f"{name}-{i}",
                              restart_on_server_restart=i % 2 == 0)
                with self.lock:
                    self.created.add(name)
                t1 = time.monotonic()
                got = client.wait(name, timeout=90)
                t2 = time.monotonic()
                self.stop.wait(self.rng.uniform(2, 6))
                client.delete(name, allow_missing=True)
                if self.args.verbose:
                    from raydist._proto import pb

                    print(f"  churn {name}: create {t1 - t0:.1f} s, {pb.State.Name(got.state)} after {t2 - t1:.1f} s, "
                          f"deleted after {time.monotonic() - t2:.1f} s", flush=True)
            except Exception as exc:  # noqa: BLE001 - a fault may hit any step; the loop goes on
                print(f"  churn {name}: {str(exc).splitlines()[0][:160]}", flush=True)
                self.stop.wait(1)
        client.close()

    # -- faults --------------------------------------------------------------

    def fault(self) -> str | None:
        """One fault, of a kind that finds a target now. Each round ends with
        one of the faults that are steps of their own (sooner when its kills
        find nothing to hit) and a server restart (so that the other faults
        find clusters running). While nothing else can be hit (the restarted
        server's Spark is still starting) the server is killed again: a crash
        while it recovers."""
        assert self.server.proc is not None
        if not self.round:
            kills = ["executor", "supervisor", "raylet", "gcs"]
            self.rng.shuffle(kills)
            self.round = [*kills, _STORY_FAULTS[self._rounds % len(_STORY_FAULTS)], "server"]
            self._rounds += 1
        candidates = {k: _targets(self.server.proc.pid, k) for k in ("executor", "supervisor", "raylet", "gcs")}
        kills = [k for k in self.round if k in candidates]
        hittable = [k for k in kills if candidates[k]]
        story = next((k for k in self.round if k in _STORY_FAULTS), None)
        if hittable:
            kind = hittable[0]
            self.round.remove(kind)
        elif story is not None:
            # The round's kills find no target now (or are done): its fault
            # that is steps of its own runs instead of another server kill.
            self.round.remove(story)
            return getattr(self, "_" + story.replace("-", "_"))()
        elif not kills:
            kind = "server"
            self.round.remove("server")
        else:  # none of this round's kinds has a target now: any that has, outside the round
            self.round.remove(kills[0])  # (the round moves on: a kind that never finds one cannot stall it)
            kind = next((k for k, found in candidates.items() if found), "server")
        if kind == "server":
            self._restart()
            return "server SIGKILLed and restarted"
        victim = self.rng.choice(candidates[kind])
        try:
            victim.kill()
        except psutil.Error:
            return None
        return f"{kind} {victim.pid} SIGKILLed"

    def _restart(self) -> None:
        self.restarting.set()
        try:
            self.server.kill()
            self.server.start()
        finally:
            self.restarting.clear()

    def _locked_store(self) -> str:
        """The server killed, then started while another process holds its
        database locked: it must refuse to start, naming the file (and keep
        every record), then start once the lock is gone."""
        import sqlite3

        self.restarting.set()
        try:
            self.server.kill()
            holder = sqlite3.connect(self.server.home / "state.db", timeout=1)
            holder.execute("BEGIN EXCLUSIVE")
            try:
                refused = False
                try:
                    self.server.start()
                    assert self.server.proc is not None
                    refused = self.server.proc.wait(timeout=90) != 0
                except (RuntimeError, subprocess.TimeoutExpired):
                    refused = self.server.proc is not None and self.server.proc.poll() not in (None, 0)
                said = (self.server.home / "server.log").read_text(errors="replace")[-4000:]
                if not refused or "state.db" not in said:
                    with self.lock:
                        self.lies.append("the server started on a locked store, or refused without naming it")
                    if self.server.proc is not None and self.server.proc.poll() is None:
                        self.server.kill()
            finally:
                holder.rollback()
                holder.close()
            self.server.start()
        finally:
            self.restarting.clear()
        return "server SIGKILLed, started on a locked store (refused), started again"

    def _delete_during_create(self) -> str:
        """A create, and its delete while it starts: one true state (DELETED), nothing left running."""
        client = self.client()
        name = f"d{len(self.faults)}"
        try:
            client.create(ClusterSpec(name=name, workers=1, cpus_per_worker=1))
            with self.lock:
                self.created.add(name)
            client.delete(name, allow_missing=True)
        finally:
            client.close()
        return f"{name} deleted while it started"

    def _delete_during_restart(self) -> str:
        """A cluster that asks to come back, the server killed and started
        again, and a delete while the new server reconciles it."""
        client = self.client()
        name = f"r{len(self.faults)}"
        try:
            client.create(ClusterSpec(name=name, workers=1, cpus_per_worker=1), restart_on_server_restart=True)
            with self.lock:
                self.created.add(name)
            client.wait(name, timeout=90)
            self._restart()
            client.delete(name, allow_missing=True)
        finally:
            client.close()
        return f"{name} deleted while a restarted server reconciled it"

    def faults_loop(self) -> None:
        # On a cadence: a fault that takes seconds (a server restart, a slow
        # process walk on a loaded host) does not push every later one back.
        due = time.monotonic()
        while True:
            due += self.rng.uniform(0.8, 1.2) * self.args.fault_every
            if self.stop.wait(max(0.0, due - time.monotonic())):
                break
            what = self.fault()
            if what:
                with self.lock:
                    self.faults.append(what)
                print(f"  fault {len(self.faults)}: {what}", flush=True)
            else:
                print("  no fault: nothing to hit now", flush=True)

    # -- the truth -----------------------------------------------------------

    def monitor(self) -> None:
        client = self.client(admin=True)
        since: dict[tuple[str, str], float] = {}
        counted: set[tuple[str, str]] = set()
        while not self.stop.wait(1.0):
            if self.restarting.is_set():
                continue
            try:
                rows = client.list()
            except Exception:  # noqa: BLE001 - the readers count read errors
                continue
            from raydist._proto import pb

            now = time.monotonic()
            seen = set()
            for row in rows:
                state = pb.State.Name(row.state)
                key = (row.spec.name, f"{state}@{row.address}")
                if not row.address or state not in ALIVE | TERMINAL:
                    continue
                procs = _cluster_processes(row.address)
                gcs = [p for p in procs if p.name() == "gcs_server"]
                contradicted = (state in ALIVE and not gcs) or (state in TERMINAL and bool(procs))
                if not contradicted:
                    continue
                seen.add(key)
                first = since.setdefault(key, now)
                if now - first > LIE_AFTER_S and key not in counted:
                    counted.add(key)
                    with self.lock:
                        self.lies.append(f"{row.spec.name} {state} at {row.address}: "
                                         f"{'no GCS' if state in ALIVE else f'{len(procs)} Ray processes'}")
                    print(f"  LIE: {self.lies[-1]}", flush=True)
            for key in list(since):
                if key not in seen:
                    del since[key]
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--fault-every", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--master", default="local-cluster[2,2,1024]")
    parser.add_argument("-v", "--verbose", action="store_true", help="say what each churn step took")
    args = parser.parse_args()
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    before = {p.pid for p in ray_processes()}
    home = Path(tempfile.mkdtemp(prefix="raydist-chaos-"))
    config = []
    for name in ("alice", "mallory"):
        token = home / f"{name}.token"
        token.write_text(f"{name}-{os.urandom(16).hex()}\n")
        token.chmod(0o600)
        config += [f"[tenants.{name}]", f'token_file = "{token}"']
        if name == "mallory":
            config.append("max_workers = 1")  # her quota: benchmarks/hostile_links.py creates past it
    config += ["[ray]", 'head = "executor"']  # tenants: every head in a Spark task of its own
    (home / "raydist.toml").write_text("\n".join(config) + "\n")
    server = Server(home, free_port(), args.master)
    server.start()
    chaos = Chaos(server, args)
    print(f"raydist serve at {server.address}, home {home}; {args.clients} readers, churn, a fault every "
          f"~{args.fault_every:g} s for {args.seconds:g} s", flush=True)
    # Let Spark come up before the faults start (a create waits for it anyway).
    warm = chaos.client()
    warm.create(ClusterSpec(name="warmup", workers=1, cpus_per_worker=1))
    warm.wait("warmup", timeout=120)
    warm.delete("warmup")
    chaos.created.add("warmup")
    threads = [threading.Thread(target=chaos.reader, args=(i,), daemon=True) for i in range(args.clients)]
    threads += [threading.Thread(target=chaos.churn, args=(k,), daemon=True) for k in range(CHURN_LOOPS)]
    threads += [threading.Thread(target=chaos.monitor, daemon=True), threading.Thread(target=chaos.faults_loop,
                                                                                      daemon=True)]
    hostile = Hostile(server.address, server.tenant_token("mallory"), "alice", lambda: list(chaos.names),
                      server.pid, chaos.stop, args.seed)
    threads += hostile.threads()
    for t in threads:
        t.start()
    time.sleep(args.seconds)
    chaos.stop.set()
    for t in threads:
        t.join(timeout=120)

    # Every cluster deleted, then the store against what was ever created (alice's, by her names).
    client = chaos.client(admin=True)
    for row in client.list():
        client.delete(row.spec.name, allow_missing=True)
    rows = {row.spec.name.removesuffix(".alice"): row for row in client.list()}
    lost = sorted(chaos.created - set(rows))
    from raydist._proto import pb

    not_deleted = [n for n, r in rows.items() if pb.State.Name(r.state) not in TERMINAL]
    client.close()
    code = server.stop()
    deadline = time.monotonic() + 30
    orphans = [p for p in ray_processes() if p.pid not in before]
    while orphans and time.monotonic() < deadline:
        time.sleep(0.5)
        orphans = [p for p in ray_processes() if p.pid not in before]
    for proc in orphans:
        try:
            print(f"  orphan: {proc.pid} {' '.join(proc.cmdline())[:120]}")
        except psutil.Error:
            pass
    lat = sorted(chaos.latencies)
    p99 = lat[int(len(lat) * 0.99) - 1] * 1000 if lat else float("nan")
    print(f"reads={len(lat)} p50_ms={statistics.median(lat) * 1000 if lat else float('nan'):.1f} "
          f"clusters_created={len(chaos.created)} server_exit={code} not_deleted={not_deleted}")
    for err in chaos.read_errors[:5]:
        print(f"  read error: {err}")
    for name in lost:
        print(f"  lost: {name}")
    print(f"attempts by attacker: {dict(sorted(hostile.attempts.items()))}")
    for breach in hostile.breaches[:5]:
        print(f"  breach: {breach}")
    print(f"faults={len(chaos.faults)} lost_clusters={len(lost)} lying_states={len(chaos.lies)} "
          f"orphans={len(orphans)} read_errors={len(chaos.read_errors)} p99_ms={p99:.1f} "
          f"hostile={hostile.total} breaches={len(hostile.breaches)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
