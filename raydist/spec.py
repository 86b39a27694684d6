"""ClusterSpec: the one description of a Ray-on-Spark cluster.

The CLI, the Python API and the control plane all build a :class:`ClusterSpec`;
it alone validates. A bad value is rejected here, once, with an error that
names the field, the value received and what is allowed.

The spec is the *desired* state. What is actually running is observed by the
engine (``RayCluster.status()``) and recorded by the control plane's store.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from raydist.errors import SpecError
from raydist.observed import ClusterStatus, NodeStatus, State

__all__ = [
    "check_name",
    "ClusterSpec",
    "State",
    "NodeStatus",
    "ClusterStatus",
    "spec_to_proto",
    "spec_from_proto",
    "parse_size",
    "format_size",
    "MAX_WORKERS",
    "MANAGED_RAY_OPTIONS",
    "ALLOWED_RAY_OPTIONS",
]

#: A cluster name is a DNS label: it becomes a Spark job tag, a directory name
#: and, on Kubernetes, part of pod labels.
# Matched whole (fullmatch): "$" alone would let a trailing newline through.
_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
#: A cluster's full name: a control plane names a tenant's cluster
#: ``NAME.TENANT`` (see raydist.control.tenants); a '.' is in no label.
_FULL_NAME_RE = re.compile(rf"{_NAME_RE.pattern}(\.{_NAME_RE.pattern})?")
_OPTION_RE = re.compile(r"[a-z][a-z0-9-]{0,63}")
_ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

MAX_WORKERS = 4096
MAX_CPUS = 1024
MAX_GPUS = 64
MAX_VALUE_LEN = 4096
#: Ray's own lower bound for a node's object store.
MIN_OBJECT_STORE = 75 << 20
MIN_MEMORY = 64 << 20

#: ``ray start`` options raydist sets itself; passing them would break the
#: cluster's wiring, so the spec refuses them.
MANAGED_RAY_OPTIONS = frozenset(
    {
        "address", "head", "block", "port", "node-ip-address", "num-cpus", "num-gpus",
        "memory", "object-store-memory", "temp-dir", "ray-client-server-port",
        "dashboard-port", "dashboard-host", "include-dashboard", "redis-password",
        "disable-usage-stats",
    }
)
#: The ``ray start`` options a cluster may set: ports, custom resources,
#: where objects spill, how logs look. Anything else is refused, so that no
#: option (``--system-config``, ``--ray-debugger-external``...) can loosen a
#: cluster's token auth or open a debugger to the network.
ALLOWED_RAY_OPTIONS = frozenset(
    {
        "resources", "object-manager-port", "node-manager-port", "min-worker-port", "max-worker-port",
        "worker-port-list", "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port",
        "metrics-export-port", "plasma-directory", "object-spilling-directory", "include-log-monitor",
        "log-style", "log-color",
    }
)
_RESERVED_ENV_PREFIXES = ("RAY_AUTH_", "RAYDIST_")
#: Environment that makes the dynamic loader run code in every process.
_LOADER_ENV = frozenset({"LD_PRELOAD", "LD_AUDIT"})


def parse_size(value: int | float | str | None, field_name: str) -> int | None:
    """Turn ``4g``, ``512MiB``, ``1.5G`` or a byte count into bytes.

    Raises SpecError naming ``field_name`` for anything else.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise SpecError(field_name, value, "expected a size such as 4g, 512m or a byte count")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise SpecError(field_name, value, "expected a non-negative size")
        return int(value)
    match = _SIZE_RE.match(str(value))
    if not match:
        raise SpecError(field_name, value, "expected a size such as 4g, 512m or a byte count")
    number, unit, _ = match.groups()
    return int(float(number) * _UNITS[unit.lower()])


def format_size(n: int | None) -> str:
    """Short human form of a byte count: 2.0GiB, 512MiB; ``-`` for None."""
    if n is None:
        return "-"
    for unit, div in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n}B"


#: Why a string with a lone surrogate (what Python makes of bytes that are not
#: UTF-8, say from os.environb) is refused: the proto, the store and every
#: process's environment carry UTF-8 text.
_NOT_UTF8 = "text must be valid Unicode that UTF-8 can carry (no lone surrogates); decode the bytes first"


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _frozen_str_map(
    field_name: str, value: Mapping[str, Any] | None, key_re: re.Pattern[str] | None = None
) -> Mapping[str, str]:
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise SpecError(field_name, value, "expected a mapping of strings to strings")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or (key_re is not None and not key_re.fullmatch(k)):
            raise SpecError(f"{field_name}[{k!r}]", k, f"keys must match {key_re.pattern if key_re else 'a string'}")
        if not _utf8(k):
            raise SpecError(f"{field_name}[{k!r}]", k, _NOT_UTF8)
        if isinstance(v, bool):
            v = "true" if v else "false"
        if not isinstance(v, (str, int, float)):
            raise SpecError(f"{field_name}[{k!r}]", v, "values must be strings or numbers")
        sv = str(v)
        if "\x00" in sv:
            raise SpecError(f"{field_name}[{k!r}]", sv[:40], "values cannot hold NUL bytes")
        if not _utf8(sv):
            raise SpecError(f"{field_name}[{k!r}]", sv[:40], _NOT_UTF8)
        if len(sv) > MAX_VALUE_LEN:
            raise SpecError(f"{field_name}[{k!r}]", sv[:40] + "...", f"values are at most {MAX_VALUE_LEN} characters")
        out[k] = sv
    return MappingProxyType(out)


def _check_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise SpecError(name, value, f"expected a whole number between {low} and {high}")
    if not low <= value <= high:
        raise SpecError(name, value, f"expected a whole number between {low} and {high}")
    return value


def check_name(name: object, field: str = "name", *, full: bool = False) -> str:
    """``name`` when it is a valid cluster name (``full``: or a tenant's
    cluster's full name, ``NAME.TENANT``); SpecError naming ``field`` else."""
    pattern = _FULL_NAME_RE if full else _NAME_RE
    if not isinstance(name, str) or not pattern.fullmatch(name):
        raise SpecError(
            field,
            name,
            "a cluster name is a DNS label: lower-case letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters",
        )
    return name


@dataclass(frozen=True, repr=False)
class ClusterSpec:
    """What a Ray cluster on Spark should look like.

    A cluster is a Ray head on the Spark driver plus ``workers`` Ray worker
    nodes, each one long-running Spark task. Give ``workers`` for a fixed size,
    or ``min_workers``/``max_workers`` for an elastic cluster: it starts
    ``min_workers`` nodes (0 is allowed), adds nodes while Ray has work it
    cannot place, up to ``max_workers``, and removes a node Ray has counted
    idle for ``idle_timeout_s``, giving its task slot back to Spark.

    Args:
        name: DNS label (lower case, digits, ``-``, at most 63 characters).
        workers: number of Ray worker nodes (the same as ``max_workers``).
        min_workers: nodes always run; the cluster is ready once they are up.
        max_workers: the most nodes demand may grow the cluster to.
        idle_timeout_s: an elastic cluster removes a node Ray has counted idle
            this long (no task, actor resources or objects in use on it).
        cpus_per_worker: Spark task CPUs, and Ray CPUs, per node. ``None`` takes
            a whole executor (``spark.executor.cores``).
        gpus_per_worker: Spark task GPUs per node; fractions share a device.
        memory_per_worker: Ray heap memory per node (``4g``, bytes...). ``None``
            sizes it from the executor's share of its host.
        object_store_per_worker: Ray object store per node; ``None`` sizes it,
            never above the node's share of ``/dev/shm``.
        head_cpus / head_gpus: resources the head offers to Ray tasks (0 keeps
            work off the driver).
        head_memory / head_object_store: the head node's sizes.
        spark_conf: Spark settings for a SparkSession raydist creates itself.
        ray_start_options: extra ``ray start`` flags (without ``--``), from
            :data:`ALLOWED_RAY_OPTIONS`.
        env: environment for every Ray process of the cluster.
        start_timeout_s: how long ``up`` waits for the cluster to be ready.
        self_heal: resubmit a worker node whose Spark task or executor died.
        dashboard: run the Ray dashboard on the head (it also serves Ray's
            Jobs and State APIs). Off by default: its processes slow every
            start on a small host, and nothing raydist does needs it.

    Example:
        >>> spec = ClusterSpec(name="demo", workers=2, cpus_per_worker=1)
        >>> spec.desired_workers, spec.required_workers
        (2, 2)
    """

    name: str
    workers: int | None = None
    min_workers: int | None = None
    max_workers: int | None = None
    cpus_per_worker: int | None = None
    gpus_per_worker: float = 0.0
    memory_per_worker: int | str | None = None
    object_store_per_worker: int | str | None = None
    head_cpus: int = 0
    head_gpus: int = 0
    head_memory: int | str | None = None
    head_object_store: int | str | None = None
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    ray_start_options: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    start_timeout_s: float = 180.0
    idle_timeout_s: float = 60.0
    self_heal: bool = True
    dashboard: bool = False

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        check_name(self.name, full=True)
        self._normalize_workers(put)
        if self.cpus_per_worker is not None:
            put("cpus_per_worker", _check_int("cpus_per_worker", self.cpus_per_worker, 1, MAX_CPUS))
        gpus = self.gpus_per_worker
        if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or not math.isfinite(gpus):
            raise SpecError("gpus_per_worker", gpus, f"expected a number between 0 and {MAX_GPUS}")
        if not 0 <= gpus <= MAX_GPUS:
            raise SpecError("gpus_per_worker", gpus, f"expected a number between 0 and {MAX_GPUS}")
        if gpus > 1 and not float(gpus).is_integer():
            raise SpecError(
                "gpus_per_worker", gpus, "above 1 a node takes whole GPUs; use 2 or 3, not 2.5"
            )
        put("gpus_per_worker", float(gpus))
        put("head_cpus", _check_int("head_cpus", self.head_cpus, 0, MAX_CPUS))
        put("head_gpus", _check_int("head_gpus", self.head_gpus, 0, MAX_GPUS))
        for name, low in (
            ("memory_per_worker", MIN_MEMORY),
            ("object_store_per_worker", MIN_OBJECT_STORE),
            ("head_memory", MIN_MEMORY),
            ("head_object_store", MIN_OBJECT_STORE),
        ):
            size = parse_size(getattr(self, name), name)
            if size is not None and size < low:
                raise SpecError(name, getattr(self, name), f"expected at least {format_size(low)}")
            if size is not None and size > 1 << 50:
                raise SpecError(name, getattr(self, name), "expected at most 1024TiB")
            put(name, size)

        conf = _frozen_str_map("spark_conf", self.spark_conf)
        for key in conf:
            if not key.startswith("spark.") or len(key) > 256:
                raise SpecError(
                    "spark_conf", key, "Spark settings start with 'spark.' (e.g. spark.executor.memory)"
                )
        put("spark_conf", conf)
        opts = _frozen_str_map("ray_start_options", self.ray_start_options, _OPTION_RE)
        for key in opts:
            if key in MANAGED_RAY_OPTIONS:
                raise SpecError(
                    "ray_start_options",
                    key,
                    "raydist sets this `ray start` option itself; use the matching spec field "
                    "(cpus_per_worker, memory_per_worker...) instead",
                )
            if key not in ALLOWED_RAY_OPTIONS:
                raise SpecError(
                    "ray_start_options",
                    key,
                    "not a `ray start` option a cluster may set; it may set "
                    + ", ".join(sorted(ALLOWED_RAY_OPTIONS)),
                )
        put("ray_start_options", opts)
        env = _frozen_str_map("env", self.env, _ENV_RE)
        for key in env:
            if key.startswith(_RESERVED_ENV_PREFIXES):
                raise SpecError("env", key, "RAY_AUTH_* and RAYDIST_* are set by raydist itself")
            if key in _LOADER_ENV:
                raise SpecError("env", key, "the dynamic loader's settings would run code in every Ray process; "
                                "install what you need in the image or the executors' Python instead")
        put("env", env)

        t = self.start_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (1 <= t <= 86400):
            raise SpecError("start_timeout_s", t, "expected seconds between 1 and 86400")
        put("start_timeout_s", float(t))
        t = self.idle_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (1 <= t <= 86400):
            raise SpecError("idle_timeout_s", t, "expected seconds between 1 and 86400")
        put("idle_timeout_s", float(t))
        if not isinstance(self.self_heal, bool):
            raise SpecError("self_heal", self.self_heal, "expected true or false")
        if not isinstance(self.dashboard, bool):
            raise SpecError("dashboard", self.dashboard, "expected true or false")

    def _normalize_workers(self, put: Any) -> None:
        workers, low, high = self.workers, self.min_workers, self.max_workers
        if workers is not None:
            workers = _check_int("workers", workers, 0, MAX_WORKERS)
        if low is not None:
            low = _check_int("min_workers", low, 0, MAX_WORKERS)
        if high is not None:
            high = _check_int("max_workers", high, 0, MAX_WORKERS)
        if workers is not None and high is not None and workers != high:
            raise SpecError(
                "workers",
                workers,
                f"workers and max_workers ({high}) disagree; give one of them",
            )
        high = high if high is not None else workers
        if high is None:
            high = low if low is not None else 2
        if low is None:
            low = high
        if low > high:
            raise SpecError(
                "min_workers", low, f"min_workers must not exceed max_workers ({high})"
            )
        put("workers", high)
        put("max_workers", high)
        put("min_workers", low)

    # Derived values -------------------------------------------------------

    @property
    def desired_workers(self) -> int:
        """Worker nodes raydist keeps trying to run."""
        return int(self.max_workers or 0)

    @property
    def required_workers(self) -> int:
        """Worker nodes that must be up for the cluster to count as ready."""
        return int(self.min_workers or 0)

    @property
    def total_gpus(self) -> float:
        """GPUs the worker nodes take from Spark in all."""
        return self.gpus_per_worker * self.desired_workers

    # Conversion -----------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; ``ClusterSpec.from_dict`` reads it back."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = dict(value) if isinstance(value, Mapping) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClusterSpec:
        """Build a spec from a dict, rejecting keys that are not fields."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(unknown[0], data[unknown[0]], f"not a cluster field; known: {', '.join(sorted(known))}")
        return cls(**dict(data))

    def replace(self, **changes: Any) -> ClusterSpec:
        """A copy with some fields changed, validated again. Changing
        ``workers`` alone resizes a fixed-size cluster (min and max follow)."""
        if "workers" in changes:
            changes.setdefault("min_workers", None)
            changes.setdefault("max_workers", None)
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        default = ClusterSpec(name=self.name)
        parts = [f"name={self.name!r}"]
        for f in dataclasses.fields(self):
            if f.name == "name":
                continue
            value = getattr(self, f.name)
            if f.name == "env":
                # Values may be credentials; show only the keys.
                if value:
                    parts.append(f"env=<{', '.join(sorted(value))}>")
                continue
            if value != getattr(default, f.name):
                shown = dict(value) if isinstance(value, Mapping) else value
                parts.append(f"{f.name}={shown!r}")
        return f"ClusterSpec({', '.join(parts)})"


# Proto conversion -----------------------------------------------------------
# The spec is the one place that knows both shapes; _proto is imported late so
# that `import raydist` does not load protobuf.

_OPTIONAL_INTS = ("workers", "min_workers", "max_workers", "cpus_per_worker")
_SIZES = ("memory_per_worker", "object_store_per_worker", "head_memory", "head_object_store")
_MAPS = ("spark_conf", "ray_start_options", "env")


def spec_to_proto(spec: ClusterSpec) -> Any:
    """ClusterSpec -> raydist.v1.ClusterSpec."""
    from raydist._proto import pb

    msg = pb.ClusterSpec(
        name=spec.name,
        gpus_per_worker=spec.gpus_per_worker,
        head_cpus=spec.head_cpus,
        head_gpus=spec.head_gpus,
        start_timeout_s=spec.start_timeout_s,
        idle_timeout_s=spec.idle_timeout_s,
        self_heal=spec.self_heal,
        dashboard=spec.dashboard,
    )
    for name in _OPTIONAL_INTS:
        value = getattr(spec, name)
        if value is not None:
            setattr(msg, name, value)
    for name in _SIZES:
        setattr(msg, name, getattr(spec, name) or 0)
    for name in _MAPS:
        getattr(msg, name).update(dict(getattr(spec, name)))
    return msg


def spec_from_proto(msg: Any) -> ClusterSpec:
    """raydist.v1.ClusterSpec -> ClusterSpec, validated (SpecError names the field)."""
    fields: dict[str, Any] = {"name": msg.name}
    for name in _OPTIONAL_INTS:
        if msg.HasField(name):
            fields[name] = getattr(msg, name)
    if fields.get("workers") is not None and fields.get("max_workers") is not None:
        if fields["workers"] == fields["max_workers"]:
            del fields["max_workers"]
    for name in _SIZES:
        value = getattr(msg, name)
        if value < 0:
            raise SpecError(name, value, "expected a non-negative size in bytes (0 sizes it for you)")
        fields[name] = value or None
    for name in _MAPS:
        fields[name] = dict(getattr(msg, name))
    fields["gpus_per_worker"] = msg.gpus_per_worker
    fields["head_cpus"] = msg.head_cpus
    fields["head_gpus"] = msg.head_gpus
    if msg.start_timeout_s:
        fields["start_timeout_s"] = msg.start_timeout_s
    if msg.idle_timeout_s:
        fields["idle_timeout_s"] = msg.idle_timeout_s
    if msg.HasField("self_heal"):
        fields["self_heal"] = msg.self_heal
    fields["dashboard"] = msg.dashboard
    return ClusterSpec(**fields)
