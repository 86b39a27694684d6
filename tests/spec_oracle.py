"""What the control plane must accept and refuse, field by field: a table
written from the documented rules (the protos' comments, the README), not
from raydist.spec, so tests/test_rpc_fuzz.py catches a wrong rule in the
library instead of agreeing with it."""

from __future__ import annotations

from typing import Any

import grpc

_LOWER = set("abcdefghijklmnopqrstuvwxyz")
_DIGITS = set("0123456789")
_WORD = _LOWER | {c.upper() for c in _LOWER} | {"_"}
MIB = 1 << 20
#: ``ray start`` options raydist sets itself (the README): refused in a spec.
_MANAGED_OPTIONS = {"address", "head", "block", "port", "node-ip-address", "num-cpus", "num-gpus", "memory",
                    "object-store-memory", "temp-dir", "ray-client-server-port", "dashboard-port",
                    "dashboard-host", "include-dashboard", "redis-password", "disable-usage-stats"}
#: The only `ray start` options a spec may carry (the proto's comment).
_ALLOWED_OPTIONS = {"resources", "object-manager-port", "node-manager-port", "min-worker-port", "max-worker-port",
                    "worker-port-list", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                    "runtime-env-agent-port", "metrics-export-port", "plasma-directory",
                    "object-spilling-directory", "include-log-monitor", "log-style", "log-color"}
#: size field: its smallest value (0 means "size it for you"); at most 1 PiB.
_SIZES = {"memory_per_worker": 64 * MIB, "object_store_per_worker": 75 * MIB,
          "head_memory": 64 * MIB, "head_object_store": 75 * MIB}


def _label(text: str) -> bool:
    """A DNS label: 1-63 lowercase letters, digits and inner hyphens."""
    return 1 <= len(text) <= 63 and set(text) <= _LOWER | _DIGITS | {"-"} and "-" not in (text[0], text[-1])


def name_ok(name: str) -> bool:
    """A cluster's name, or NAME.TENANT (the admin names a tenant's cluster)."""
    parts = name.split(".")
    return len(parts) <= 2 and all(_label(p) for p in parts)


def _value_ok(value: str) -> bool:
    return "\x00" not in value and len(value) <= 4096


def _option_ok(key: str, value: str) -> bool:
    return (1 <= len(key) <= 64 and key[0] in _LOWER and set(key) <= _LOWER | _DIGITS | {"-"}
            and key not in _MANAGED_OPTIONS and key in _ALLOWED_OPTIONS and _value_ok(value))


def _env_ok(key: str, value: str) -> bool:
    return (1 <= len(key) <= 128 and key[0] in _WORD and set(key) <= _WORD | _DIGITS
            and not key.startswith(("RAY_AUTH_", "RAYDIST_")) and key not in {"LD_PRELOAD", "LD_AUDIT"}
            and _value_ok(value))


def _seconds_ok(t: float) -> bool:
    return t == 0 or 1 <= t <= 86400  # 0: the default; NaN is neither


def spec_errors(spec: Any) -> set[str]:
    """The fields of a ClusterSpec proto a create must refuse."""
    bad = set()
    if not name_ok(spec.name):
        bad.add("name")
    counts = {f: getattr(spec, f) for f in ("workers", "min_workers", "max_workers") if spec.HasField(f)}
    bad |= {f for f, n in counts.items() if not 0 <= n <= 4096}
    if not bad & set(counts):
        if "workers" in counts and "max_workers" in counts and counts["workers"] != counts["max_workers"]:
            bad.add("workers")  # two answers to one question
        else:
            high = counts.get("max_workers", counts.get("workers", counts.get("min_workers", 2)))
            if counts.get("min_workers", high) > high:
                bad.add("min_workers")
    if spec.HasField("cpus_per_worker") and not 1 <= spec.cpus_per_worker <= 1024:
        bad.add("cpus_per_worker")
    gpus = spec.gpus_per_worker
    if not (0 <= gpus <= 64 and (gpus <= 1 or gpus == int(gpus))):  # whole GPUs above one
        bad.add("gpus_per_worker")
    if not 0 <= spec.head_cpus <= 1024:
        bad.add("head_cpus")
    if not 0 <= spec.head_gpus <= 64:
        bad.add("head_gpus")
    for field, low in _SIZES.items():
        size = getattr(spec, field)
        if size != 0 and not low <= size <= 1 << 50:
            bad.add(field)
    if spec.spark_conf:
        bad.add("spark_conf")  # a cluster runs on the server's Spark: its settings are the server's
    if not all(_option_ok(k, v) for k, v in spec.ray_start_options.items()):
        bad.add("ray_start_options")
    if not all(_env_ok(k, v) for k, v in spec.env.items()):
        bad.add("env")
    for field in ("start_timeout_s", "idle_timeout_s"):
        if not _seconds_ok(getattr(spec, field)):
            bad.add(field)
    return bad


def request_id_ok(rid: str) -> bool:
    return len(rid) <= 128 and all(32 <= ord(c) < 127 for c in rid)


def expect_invalid(code: grpc.StatusCode, details: str, fields: set[str]) -> None:
    """INVALID_ARGUMENT, its message naming one of the invalid ``fields`` first."""
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details, fields)
    assert any(details.startswith(f) for f in fields), (details, fields)
