"""One exception hierarchy for raydist.

Every error raydist raises on purpose derives from :class:`RaydistError`. The
control plane maps these classes to gRPC status codes in exactly one place
(``raydist.control.status``); this module knows nothing about gRPC so that the
engine and the training facade stay importable without it.

Exceptions that may cross process boundaries (Spark tasks, Ray workers) define
``__reduce__`` so they pickle with their attributes intact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "JobNotFoundError",
    "RaydistError",
    "SpecError",
    "CapacityError",
    "QuotaExceededError",
    "NodeStartTimeoutError",
    "ClusterNotFoundError",
    "ClusterExistsError",
    "ClusterFailedError",
    "ClusterNotReadyError",
    "ConnectionInUseError",
    "DataFormatError",
    "AuthenticationError",
    "StoreUnavailableError",
    "ControlPlaneUnavailableError",
    "RPCError",
    "TrainingConfigError",
]


class RaydistError(Exception):
    """Root of every error raydist raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, self.args)


class SpecError(RaydistError, ValueError):
    """A cluster or training description is invalid.

    Attributes:
        field: the name of the offending field, as the user spelled it.
        value: the value received.
        allowed: what would have been accepted, in words.
    """

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}: got {value!r}; {allowed}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.field, self.value, self.allowed))


class TrainingConfigError(SpecError):
    """A trainer or distributor was given arguments that cannot work."""


class CapacityError(RaydistError):
    """The Spark cluster can never schedule what was asked for.

    Raised at ``up`` time, before any node starts, instead of letting Spark
    wait forever for task slots that do not exist.

    Attributes:
        asked: what the cluster spec needs, in words.
        available: what the Spark cluster offers, in words.
    """

    def __init__(self, asked: str, available: str, fix: str = "") -> None:
        self.asked = asked
        self.available = available
        self.fix = fix
        msg = f"Spark cannot fit this cluster: asked for {asked}, but {available}"
        super().__init__(msg + (f"; {fix}" if fix else ""))

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.asked, self.available, self.fix))


class QuotaExceededError(RaydistError):
    """A tenant asked for more than its quota allows (``[tenants.NAME]``).

    Attributes:
        tenant: the tenant.
        what: the quota's key (``max_clusters``, ``max_workers``...).
        limit: its value.
        detail: what the tenant holds now, in words.
    """

    def __init__(self, tenant: str, what: str, limit: int, detail: str) -> None:
        self.tenant = tenant
        self.what = what
        self.limit = limit
        self.detail = detail
        super().__init__(f"tenant {tenant} is at its quota ({what} = {limit}): {detail}; free some "
                         f"(raydist down, smaller clusters, fewer calls at once), or ask the control plane's admin "
                         f"for a larger {what} in [tenants.{tenant}]")

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.tenant, self.what, self.limit, self.detail))


class NodeStartTimeoutError(RaydistError, TimeoutError):
    """Ray nodes did not come up within the start timeout.

    Attributes:
        expected: how many worker nodes had to be ready.
        started: how many were ready when the deadline passed.
        timeout: the deadline, in seconds.
        pending: for each node that did not come up, the last lines of its log
            (or why there is no log, e.g. no Spark task slot was free).
    """

    def __init__(
        self,
        expected: int,
        started: int,
        timeout: float,
        pending: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.expected = expected
        self.started = started
        self.timeout = timeout
        self.pending = {k: list(v) for k, v in (pending or {}).items()}
        lines = [
            f"{started} of {expected} Ray worker nodes ready after {timeout:g} s; "
            f"not ready: {', '.join(sorted(self.pending)) or '-'}"
        ]
        for node, tail in sorted(self.pending.items()):
            lines.append(f"--- {node} ---")
            lines.extend(f"  {line}" for line in tail[-20:])
        super().__init__("\n".join(lines))

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.expected, self.started, self.timeout, self.pending))


class LinkPortsInUseError(RaydistError):
    """Every port of ``server.link_ports`` has a cluster's node link on it."""

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high
        super().__init__(f"every port of server.link_ports ({low}-{high}) is in use, one per running cluster: "
                         "widen the range (and the firewall rule or NetworkPolicy that names it), "
                         "or tear a cluster down")


class ClusterNotFoundError(RaydistError, LookupError):
    """No cluster of that name is known here."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"no cluster named {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.name,))


class JobNotFoundError(RaydistError, LookupError):
    """A cluster has no Ray job by that id."""

    def __init__(self, cluster: str, job_id: str) -> None:
        self.cluster = cluster
        self.job_id = job_id
        super().__init__(f"cluster {cluster!r} has no job {job_id!r}; `raydist jobs {cluster}` lists them")

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.cluster, self.job_id))


class ClusterExistsError(RaydistError):
    """A cluster of that name already exists with another spec."""

    def __init__(self, name: str, detail: str = "") -> None:
        self.name = name
        self.detail = detail
        super().__init__(
            f"a cluster named {name!r} already exists"
            + (f": {detail}" if detail else "; pick another name or run `raydist down` first")
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.name, self.detail))


class ClusterFailedError(RaydistError, RuntimeError):
    """A cluster could not start or stopped working, or a training run
    failed outside the user's code; the message says why. A RuntimeError,
    as Spark's distributors raise for a failed run."""


class ClusterNotReadyError(RaydistError):
    """The cluster exists but is not in a state that allows this (no head yet,
    or gone); the message says which state and what to do."""


class ConnectionInUseError(RaydistError):
    """This process is connected to another Ray cluster, and Ray allows one
    connection per process.

    Attributes:
        current: the GCS address this process is connected to.
        wanted: the GCS address asked for.
    """

    def __init__(self, current: str, wanted: str) -> None:
        self.current = current
        self.wanted = wanted
        super().__init__(
            f"this process is connected to the Ray cluster at {current}, not {wanted}; Ray allows one "
            "connection per process: call ray.shutdown() first, or use that cluster"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.current, self.wanted))


class DataFormatError(RaydistError, TypeError):
    """A DataFrame column has no Arrow form (so it cannot move to Ray Data)."""

    def __init__(self, column: str, type_name: str, detail: str = "") -> None:
        self.column = column
        self.type_name = type_name
        self.detail = detail
        super().__init__(f"column {column!r} of type {type_name} has no Arrow form{': ' + detail if detail else ''}; "
                         "cast it first (for example to string) or drop it")

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.column, self.type_name, self.detail))


class HomeInUseError(RaydistError):
    """Another control plane already serves this ``RAYDIST_HOME``: two would
    overwrite each other's store and tell each other's clusters apart wrong.

    Attributes:
        home: the directory.
        other: which server holds it, when known.
    """

    #: The exit code of a ``raydist serve`` that found its home in use.
    EXIT_CODE = 3

    def __init__(self, home: str, other: str = "") -> None:
        self.home = home
        self.other = other
        super().__init__(
            f"another raydist control plane serves RAYDIST_HOME={home}{other}; "
            "use it (RAYDIST_ADDRESS), stop it, or give this one another RAYDIST_HOME"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.home, self.other))


class StoreUnavailableError(RaydistError):
    """The control plane's store exists but cannot be opened now (locked by
    another process, a full disk, an I/O error). It is left as it is: its
    clusters' records are whole once the cause is fixed.

    Attributes:
        path: the database file.
        reason: SQLite's own words.
    """

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"the control plane's store {path} cannot be opened: {reason}; it was left untouched. "
                         "Stop whatever holds it (another `raydist serve` on a copy of this home, a sqlite3 "
                         "shell), free disk space, or fix the file system, then start again")

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.path, self.reason))


class AuthenticationError(RaydistError):
    """A credential was missing or wrong. The message never contains it."""


class ControlPlaneUnavailableError(RaydistError, ConnectionError):
    """No control plane answered at the given address."""


class RPCError(RaydistError):
    """A control-plane call failed.

    Attributes:
        code: the gRPC status code name (``"NOT_FOUND"``, ``"INVALID_ARGUMENT"``...).
        details: the server's message.
    """

    def __init__(self, code: str, details: str) -> None:
        self.code = code
        self.details = details
        super().__init__(f"{code}: {details}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.code, self.details))
