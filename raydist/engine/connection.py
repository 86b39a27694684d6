"""This process's Ray connection and default cluster, and their one owner.

Ray allows one connection per process (``ray.init``), and finds the default
cluster of a process and of its subprocesses in the environment
(``RAY_ADDRESS``, ``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN``). Several raydist
clusters may come and go in one process: the session cluster, clusters from
``raydist.up``, served clusters attached by name. :class:`ProcessRay` owns
both, so that no teardown leaves the process behind:

- **A cluster that goes is disconnected first.** Whatever tears it down (the
  user's ``down()``, the session cluster idling or yielding its slots, its
  replacement by a bigger one, ``spark.stop()``, exit), this process's
  connection to it ends before its nodes stop, whether raydist made it or
  the user called ``ray.init`` themselves. Otherwise Ray's core worker keeps
  dialing the dead GCS and, a minute later, ends the whole process.
- **The default cluster is a stack.** ``raydist.up`` makes its cluster the
  default (as ``ray.util.spark.setup_ray_cluster`` does); the newest cluster
  still up is the default, and when the last one goes the environment is
  exactly what it was before the first. A variable the user changed since
  raydist wrote it is the user's, and stays.
- **A connection takes its token only while it is made.** Ray reads the token
  when it connects and keeps it for the connection, so ``connect`` sets it
  for the ``ray.init`` call alone: the connection leaves nothing in the
  environment that a later Ray cluster (``ray.util.spark``'s, say) would
  inherit.
- **No thread is inside Ray when the connection ends.** Ray frees its core
  worker on ``ray.shutdown`` under any thread still waiting in it (a crash,
  SIGSEGV, not an error). raydist's own Ray calls mark themselves
  (:meth:`ProcessRay.calling`); a disconnect first has the hooks end that
  work, then waits for those calls to return.
- **The environment changes only on the user's threads.** A teardown on one
  of raydist's own threads (:mod:`raydist.engine.threads`) marks the change
  pending, and the next raydist call on a user's thread (or exit) makes it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

from raydist.engine.auth import RayToken, reload_auth_in_process
from raydist.engine.ports import gcs_host
from raydist.engine.threads import on_raydist_thread

__all__ = ["ProcessRay", "DefaultEnv", "process_ray", "DEFAULT_KEYS", "same_address"]

log = logging.getLogger(__name__)

#: What makes a cluster a process's default one.
DEFAULT_KEYS = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
_AUTH_KEYS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
#: How long a disconnect waits for raydist's calls into Ray to return once
#: the hooks have ended the work they wait on (a warm run's controller is
#: killed, and a job's wait returns at once: well under a second here).
_CALLS_LEAVE_S = 30.0


class DefaultEnv:
    """The stack of default clusters, and the environment it implies.

    Pure bookkeeping over a mapping (``os.environ`` in use, a dict in tests):
    :meth:`apply` writes the top of the stack, or what was there before the
    first push once the stack is empty.
    """

    def __init__(self, environ: MutableMapping[str, str]) -> None:
        self._environ = environ
        self._stack: list[tuple[object, dict[str, str]]] = []
        self._before: dict[str, str | None] | None = None  # the environment before the first push
        self._written: dict[str, str | None] = {}  # what apply() last wrote, key by key

    def push(self, key: object, values: Mapping[str, str]) -> None:
        """Make ``values`` the default (replacing ``key``'s earlier entry)."""
        if self._before is None:
            self._before = {k: self._environ.get(k) for k in DEFAULT_KEYS}
        self._stack = [entry for entry in self._stack if entry[0] is not key]
        self._stack.append((key, {k: v for k, v in values.items() if k in DEFAULT_KEYS}))

    def remove(self, key: object) -> bool:
        """Drop ``key``'s entry; whether it had one."""
        kept = [entry for entry in self._stack if entry[0] is not key]
        removed = len(kept) != len(self._stack)
        self._stack = kept
        return removed

    def top(self) -> dict[str, str] | None:
        return dict(self._stack[-1][1]) if self._stack else None

    def apply(self) -> bool:
        """Write what the stack implies; whether anything changed."""
        if self._before is None:
            return False
        top = self.top()
        target = {k: (top.get(k) if top is not None else self._before[k]) for k in DEFAULT_KEYS}
        changed = False
        for key, value in target.items():
            current = self._environ.get(key)
            if key in self._written and current != self._written[key]:
                continue  # the user set it since raydist did: it is theirs now
            if current != value:
                if value is None:
                    self._environ.pop(key, None)
                else:
                    self._environ[key] = value
                changed = True
            self._written[key] = value
        if top is None:
            self._before, self._written = None, {}
        return changed


class ProcessRay:
    """The owner of this process's Ray connection and default cluster (see
    the module docstring). Get it with :func:`process_ray`."""

    def __init__(self, environ: MutableMapping[str, str] | None = None) -> None:
        self._lock = threading.RLock()  # held while connecting or disconnecting; never while calling hooks
        self._environ = os.environ if environ is None else environ
        self._defaults = DefaultEnv(self._environ)
        self._pending = False  # an environment change a raydist thread left for a user's thread
        self._hooks: list[Callable[[str], None]] = []
        self._using = 0  # raydist calls working through the connection now (a data handoff)
        self._used_at: float | None = None
        self._inside: dict[int, int] = {}  # thread -> raydist calls of it inside Ray now
        self._left = threading.Condition()  # guards _inside
        self._connector: concurrent.futures.ThreadPoolExecutor | None = None  # see _init

    # ------------------------------------------------------------ use

    @contextlib.contextmanager
    def using(self) -> Iterator[None]:
        """Mark raydist work on this process's Ray connection that is not a
        training run (a DataFrame handoff): the cluster it reaches is in use
        while it runs, and its idle time counts from the end."""
        with self._lock:
            self._using += 1
        try:
            with self.calling():
                yield
        finally:
            with self._lock:
                self._using -= 1
                self._used_at = time.monotonic()

    @contextlib.contextmanager
    def calling(self) -> Iterator[None]:
        """Mark a raydist call into Ray on this thread (a run's wait, a data
        handoff): a disconnect waits for it to return (after its hooks have
        ended the work it waits on)."""
        me = threading.get_ident()
        with self._left:
            self._inside[me] = self._inside.get(me, 0) + 1
        try:
            yield
        finally:
            with self._left:
                self._inside[me] -= 1
                if not self._inside[me]:
                    del self._inside[me]
                self._left.notify_all()

    def _wait_for_calls(self, timeout_s: float) -> None:
        """Wait until no other thread is inside a raydist call into Ray."""
        me = threading.get_ident()
        with self._left:
            if not self._left.wait_for(lambda: not (self._inside.keys() - {me}), timeout_s):
                log.warning("disconnecting from Ray while %d raydist thread(s) still wait in it",
                            len(self._inside.keys() - {me}))

    def handing_off(self) -> bool:
        """Whether :meth:`using` work runs now (its Spark job's tasks wait
        for slots of their own: not work to make room for)."""
        with self._lock:
            return self._using > 0

    def last_use(self) -> float | None:
        """When :meth:`using` work last ran (now, while some runs), or None."""
        with self._lock:
            return time.monotonic() if self._using else self._used_at

    # ---------------------------------------------------------- hooks

    def before_disconnect(self, hook: Callable[[str], None]) -> None:
        """Call ``hook(gcs_address)`` before a cluster this process may use
        goes (to end what runs on it, such as a warm training run)."""
        with self._lock:
            if hook not in self._hooks:
                self._hooks.append(hook)

    # ---------------------------------------------------- environment

    def sync(self) -> None:
        """Make a pending environment change, when called on a user's thread."""
        with self._lock:
            self._apply()

    def make_default(self, key: object, env: Mapping[str, str]) -> None:
        """Make a cluster (``env``: its ``RAY_ADDRESS`` and token) this
        process's default until :meth:`cluster_gone`."""
        with self._lock:
            self._defaults.push(key, env)
            self._pending = True
            self._apply()

    def default(self) -> dict[str, str] | None:
        """The default cluster's environment, while one is up."""
        with self._lock:
            return self._defaults.top()

    def _apply(self) -> None:
        if not self._pending or on_raydist_thread():
            return
        self._pending = False
        if self._defaults.apply():
            self._settle_auth()

    def _settle_auth(self) -> None:
        """Have Ray read the auth settings again when nothing is connected
        (a live connection keeps the token it was made with)."""
        if not _ray_connected():
            reload_auth_in_process()

    # ----------------------------------------------------- connection

    def connect(self, address: str, token: RayToken, *, target: str | None = None, **init_kwargs: Any) -> Any:
        """``ray.init`` this process to the cluster whose GCS is ``address``
        (through ``target``, a ``ray://`` address, when given), with its
        token. Connected there already: nothing to do. Connected elsewhere:
        ConnectionInUseError, naming the cluster to leave first."""
        import ray

        from raydist.errors import ConnectionInUseError

        with self._lock:
            self._apply()
            current = connected_address()
            if current is not None:
                if same_address(current, address):
                    return None
                raise ConnectionInUseError(current, address)
            with self._token_for_init(token):
                return self._init(ray.init, target or address, init_kwargs)

    def _init(self, init: Callable[..., Any], address: str, kwargs: dict[str, Any]) -> Any:
        """``init(address, **kwargs)`` on the main thread or, from any other
        thread, on this process's one connector thread, which makes no other
        Ray call. Ray gives the thread that connects the driver's task id,
        and each thread numbers its own ``ray.put`` objects: two threads that
        each connected once (a reconnect from a second thread, as in a
        CrossValidator's parallel fits) would both number objects under
        that id, and the second to reach a number ends the process in a
        failed check (``Tried to create an owned object that already
        exists``). Connecting only here leaves the main thread the one
        thread that both holds the id and puts objects."""
        if threading.current_thread() is threading.main_thread():
            return init(address, **kwargs)
        if self._connector is None:
            self._connector = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="raydist-ray-connect")
        return self._connector.submit(init, address, **kwargs).result()

    @contextlib.contextmanager
    def _token_for_init(self, token: RayToken) -> Iterator[None]:
        saved = {k: self._environ.get(k) for k in _AUTH_KEYS}
        wanted = token.env()
        fresh = saved != wanted
        if fresh:
            self._environ.update(wanted)
            reload_auth_in_process()
        try:
            yield
        finally:
            if fresh:
                for key, value in saved.items():
                    if value is None:
                        self._environ.pop(key, None)
                    else:
                        self._environ[key] = value
                self._settle_auth()  # only when the init failed: a connection keeps its token

    def disconnect(self) -> None:
        """End this process's Ray connection, whatever it reaches (after
        what runs on it here, through the hooks)."""
        current = connected_address()
        if current is not None:
            self._disconnect_from(current)

    def cluster_gone(self, key: object, address: str) -> None:
        """The cluster ``key`` (GCS ``address``) is about to go: end what
        runs on it here, disconnect this process from it (raydist's
        connection or the user's own), and drop it from the default stack."""
        if address:
            self._disconnect_from(address)
        with self._lock:
            if self._defaults.remove(key):
                self._pending = True
            self._apply()

    def _disconnect_from(self, address: str) -> None:
        for hook in self._snapshot_hooks():
            try:
                hook(address)
            except Exception:  # noqa: BLE001 - a hook must not stop the teardown
                log.exception("ending work on %s before its teardown", address)
        current = connected_address()
        if current is None or not same_address(current, address):
            return
        self._wait_for_calls(_CALLS_LEAVE_S)
        with self._lock:
            current = connected_address()
            if current is not None and same_address(current, address):
                import ray

                log.info("disconnecting this process from the Ray cluster at %s", address)
                ray.shutdown()
                self._settle_auth()

    def _snapshot_hooks(self) -> list[Callable[[str], None]]:
        with self._lock:
            return list(self._hooks)


def connected_address() -> str | None:
    """The GCS address this process's Ray connection reaches (a direct or
    a Ray Client connection), or None."""
    if "ray" not in sys.modules:
        return None
    import ray

    if not ray.is_initialized():
        return None
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # noqa: BLE001 - a connection being torn down
        return None


def _ray_connected() -> bool:
    return "ray" in sys.modules and bool(sys.modules["ray"].is_initialized())


def same_address(a: str, b: str) -> bool:
    """Whether two ``host:port`` addresses name the same endpoint as Ray sees
    them (a host name and its address count as one, and a loopback address
    as this machine's, as Ray connects it)."""
    if a == b:
        return True
    host_a, _, port_a = a.rpartition(":")
    host_b, _, port_b = b.rpartition(":")
    return port_a == port_b and gcs_host(host_a) == gcs_host(host_b)


_owner: ProcessRay | None = None
_owner_lock = threading.Lock()


def process_ray() -> ProcessRay:
    """This process's :class:`ProcessRay`."""
    global _owner
    with _owner_lock:
        if _owner is None:
            _owner = ProcessRay()
        return _owner
