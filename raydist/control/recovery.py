"""Bringing clusters back: after the control plane restarts (reconcile,
restart) and after a Spark application dies (spark_died), each on its own
Spark host.

A part of :class:`~raydist.control.manager.ClusterManager` (it inherits this)."""

from __future__ import annotations

import logging
import threading
import time

from raydist.control.sparkhost import SparkHost
from raydist.errors import ControlPlaneUnavailableError
from raydist.spec import ClusterSpec, State

__all__ = ["ClusterRecovery"]

log = logging.getLogger("raydist.control.manager")


class ClusterRecovery:
    """The manager's recovery: clusters brought back after a restart or a Spark death."""

    def spark_died(self, host: SparkHost | None = None) -> list[str]:
        """``host``'s SparkContext (the control plane's own when None) died:
        its JVM was killed, it stopped itself, and every cluster on it died
        with it. Tear what is left of them down, mark each CREATING when its
        spec asks to come back (returned, for :meth:`restart` once a new
        session runs) or FAILED with the reason, and let go of the dead
        session. Clusters on the other Sparks are not touched."""
        from raydist.engine.spark.sides import side_of

        host = host or self.spark_host
        spark = host.lose("its SparkContext died; a new one is starting")
        with self._lock:
            engines = {name: engine for name, engine in self._engines.items() if self.host_of(name) is host}
            for name in engines:
                del self._engines[name]
        for name, engine in engines.items():
            try:
                engine.down(timeout=15.0)
            except Exception:  # noqa: BLE001 - as much as can be torn down
                log.exception("tearing down %s after Spark died", name)
        back = []
        with self._lock:
            for name in engines:
                row = self._store.get(name)
                if row is None or row.state in (State.DELETED.value, State.DELETING.value):
                    continue
                if self._ended(row, back="the control plane's Spark died; starting again",
                               failed="the control plane's Spark died, and the cluster with it"):
                    back.append(name)
        if spark is not None:
            side_of(spark).discard()
        return back

    def reconcile(self) -> list[str]:
        """After a restart, before serving: every cluster the last server ran
        is marked CREATING when its spec asks to come back (returned, for
        :meth:`restart`), else FAILED with the reason; no row is dropped. The
        old server's Ray processes died with it (their supervisors watch it).
        Rows are taken one by one: one that cannot be read, or whose spec the
        current rules reject (written before a rule was added), is FAILED
        with the reason, and the rest come back. Store writes only: it does
        not wait for Spark."""
        restart = []
        for name, row, why in self._store.scan():
            try:
                if row is not None:
                    ClusterSpec.from_dict(row.spec)  # today's rules
            except Exception as exc:  # noqa: BLE001 - the reason goes to the row
                why = f"its spec breaks a rule of this version: {exc}"
            if row is None or why:
                message = (f"the control plane could not bring this cluster back: {why}. Delete it "
                           f"(raydist down {name}) and create it again")[:2000]
                log.warning("cluster %s: %s", name, message)
                if row is None or row.state != State.FAILED.value or row.message != message:
                    self._store.mark_failed(name, message)
                    self._store.add_event(name, State.FAILED.value, message)
                self._protos.unreadable(name, message)
                continue
            if row.state == State.DELETING.value:
                # Asked to go, and its processes went with the last server.
                row.state, row.message, row.ready_workers = State.DELETED.value, "deleted (the control plane " \
                    "restarted while tearing it down)", 0
                row.address = row.client_address = row.dashboard_url = ""
                self._store.put(row)
                self._store.add_event(row.name, row.state, row.message)
            elif row.state not in (State.DELETED.value, State.FAILED.value) and self._ended(
                    row, back="control plane restarted; starting again", refresh=False,
                    failed="the control plane restarted; the cluster's Ray processes were stopped with it"):
                restart.append(row.name)
            self._store.prune(row.name)
            self._refresh(row)
        return restart

    def restart(self, names: list[str]) -> None:
        """Start again the clusters :meth:`reconcile` marked (in the
        background, once the server serves). One that Spark cannot fit, or
        that fails to start, is FAILED with the reason; its row stays. Each
        Spark's clusters wait for that Spark alone: a tenant's application
        that is down holds back no other's."""
        by_host: dict[SparkHost, list[str]] = {}
        for name in names:
            by_host.setdefault(self.host_of(name), []).append(name)
        waits = [threading.Thread(target=self._restart_on, args=(host, some), name="raydist-restart-wait",
                                  daemon=True) for host, some in by_host.items()]
        for wait in waits:
            wait.start()
        for wait in waits:
            wait.join()

    def _restart_on(self, host: SparkHost, names: list[str]) -> None:
        from raydist.engine.spark import session as spark_side

        for name in names:
            row = self._store.get(name)
            if row is None or row.state != State.CREATING.value:
                continue  # deleted meanwhile
            spec = ClusterSpec.from_dict(row.spec)
            while True:  # a row waits (CREATING) while Spark is retried
                try:
                    spark = host.session
                    break
                except ControlPlaneUnavailableError:
                    time.sleep(2.0)
            try:
                cap = spark_side.capacity(spark)
                spark_side.check_fits(spec, cap, head_in_task=self._head_in_task(name))
            except Exception as exc:  # noqa: BLE001 - the reason goes to the row, the server keeps serving
                self._fail(name, f"could not start again after the control plane restarted: {exc}")
                continue
            with self._lock:
                row = self._store.get(name)
                if row is None or row.state != State.CREATING.value:
                    continue  # deleted while Spark came up
                self._starting[name] = row.created
            threading.Thread(target=self._start, args=(spec, row), name=f"raydist-restart-{name}", daemon=True).start()

