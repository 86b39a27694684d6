"""ClusterSpec validation: every bad value is rejected with the field named."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raydist.errors import SpecError
from raydist.spec import MANAGED_RAY_OPTIONS, ClusterSpec, parse_size
from tests.spec_oracle import MIB, name_ok, spec_errors

#: Text a spec may hold: no NUL, no lone surrogate (both refused, tested below).
_UTF8_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")

pytestmark = pytest.mark.unit

DNS = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")


@given(DNS)
def test_dns_label_names_are_accepted(name: str) -> None:
    assert ClusterSpec(name=name).name == name


@given(DNS, DNS)
def test_a_tenants_full_cluster_name_is_accepted(name: str, tenant: str) -> None:
    assert ClusterSpec(name=f"{name}.{tenant}").name == f"{name}.{tenant}"


@given(st.one_of(st.text(min_size=0, max_size=80), st.sampled_from(["a.", ".a", "a..b", "a.b.c", "a.-b", "A.b"])))
def test_other_names_are_rejected_naming_the_field(name: str) -> None:
    import re

    label = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
    if re.fullmatch(rf"{label}(\.{label})?", name):
        return
    with pytest.raises(SpecError) as err:
        ClusterSpec(name=name)
    assert err.value.field == "name"
    assert "DNS label" in str(err.value)


@given(st.integers())
def test_worker_counts_outside_bounds_name_the_field(n: int) -> None:
    if 0 <= n <= 4096:
        assert ClusterSpec(name="a", workers=n).desired_workers == n
    else:
        with pytest.raises(SpecError) as err:
            ClusterSpec(name="a", workers=n)
        assert err.value.field == "workers" and str(n) in str(err.value)


@given(st.integers(0, 50), st.integers(0, 50))
def test_min_max_workers(low: int, high: int) -> None:
    if low <= high:
        spec = ClusterSpec(name="a", min_workers=low, max_workers=high)
        assert (spec.required_workers, spec.desired_workers) == (low, high)
    else:
        with pytest.raises(SpecError, match="min_workers"):
            ClusterSpec(name="a", min_workers=low, max_workers=high)


def test_workers_and_max_workers_must_agree() -> None:
    with pytest.raises(SpecError, match="disagree"):
        ClusterSpec(name="a", workers=2, max_workers=3)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_gpus(g: float) -> None:
    ok = g == g and 0 <= g <= 64 and (g <= 1 or float(g).is_integer())
    if ok:
        assert ClusterSpec(name="a", gpus_per_worker=g).gpus_per_worker == g
    else:
        with pytest.raises(SpecError) as err:
            ClusterSpec(name="a", gpus_per_worker=g)
        assert err.value.field == "gpus_per_worker"


@pytest.mark.parametrize(
    "text,expected",
    [("4g", 4 << 30), ("512m", 512 << 20), ("512MiB", 512 << 20), ("1.5G", int(1.5 * (1 << 30))), (1024, 1024)],
)
def test_parse_size(text: object, expected: int) -> None:
    assert parse_size(text, "memory_per_worker") == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["lots", "-1g", "4x", True, float("nan")])
def test_bad_sizes_name_the_field(bad: object) -> None:
    with pytest.raises(SpecError) as err:
        ClusterSpec(name="a", memory_per_worker=bad)  # type: ignore[arg-type]
    assert err.value.field == "memory_per_worker"


def test_object_store_below_ray_minimum() -> None:
    with pytest.raises(SpecError, match="at least 75.0MiB"):
        ClusterSpec(name="a", object_store_per_worker="10m")


@pytest.mark.parametrize("option", sorted(MANAGED_RAY_OPTIONS))
def test_managed_ray_options_are_refused(option: str) -> None:
    with pytest.raises(SpecError, match="sets this `ray start` option itself"):
        ClusterSpec(name="a", ray_start_options={option: "1"})


@pytest.mark.parametrize("option", ["system-config", "ray-debugger-external", "autoscaling-config",
                                    "proxy-server-url", "cgroup-path", "no-redirect-output", "made-up"])
def test_ray_options_outside_the_allowlist_are_refused(option: str) -> None:
    with pytest.raises(SpecError, match="not a `ray start` option a cluster may set") as caught:
        ClusterSpec(name="a", ray_start_options={option: "1"})
    assert caught.value.field == "ray_start_options" and "min-worker-port" in str(caught.value)


def test_the_allowed_ray_options_are_taken_as_given() -> None:
    opts = {"resources": '{"tpu": 1}', "min-worker-port": "20000", "max-worker-port": "20100",
            "object-spilling-directory": "/mnt/spill", "log-style": "record"}
    assert dict(ClusterSpec(name="a", ray_start_options=opts).ray_start_options) == opts


@given(st.text(alphabet=string.ascii_letters + "._-", min_size=1, max_size=30))
def test_spark_conf_keys_must_be_spark_settings(key: str) -> None:
    if key.startswith("spark."):
        assert ClusterSpec(name="a", spark_conf={key: "1"}).spark_conf[key] == "1"
    else:
        with pytest.raises(SpecError, match="start with 'spark.'"):
            ClusterSpec(name="a", spark_conf={key: "1"})


def test_reserved_env_and_oversized_values() -> None:
    with pytest.raises(SpecError, match="RAY_AUTH"):
        ClusterSpec(name="a", env={"RAY_AUTH_TOKEN": "x"})
    with pytest.raises(SpecError, match="at most 4096"):
        ClusterSpec(name="a", env={"X": "y" * 5000})


def test_repr_hides_env_values_and_defaults() -> None:
    spec = ClusterSpec(name="demo", workers=3, env={"SECRET": "hunter2"})
    text = repr(spec)
    assert "hunter2" not in text and "SECRET" in text
    assert "head_cpus" not in text


@settings(max_examples=50)
@given(
    name=DNS,
    workers=st.integers(0, 64),
    cpus=st.one_of(st.none(), st.integers(1, 64)),
    gpus=st.sampled_from([0, 0.25, 0.5, 1, 2]),
    conf=st.dictionaries(st.from_regex(r"\Aspark\.[a-z]{1,10}\Z"),
                         st.text(_UTF8_CHARS, max_size=20), max_size=3),
)
def test_dict_round_trip(name: str, workers: int, cpus: int | None, gpus: float, conf: dict[str, str]) -> None:
    spec = ClusterSpec(name=name, workers=workers, cpus_per_worker=cpus, gpus_per_worker=gpus, spark_conf=conf)
    assert ClusterSpec.from_dict(spec.to_dict()) == spec


def test_from_dict_rejects_unknown_fields() -> None:
    with pytest.raises(SpecError) as err:
        ClusterSpec.from_dict({"name": "a", "wrokers": 2})
    assert err.value.field == "wrokers"


@pytest.mark.parametrize(
    "field, value",
    [("name", "demo\n"), ("env", {"PATH\n": "x"}), ("ray_start_options", {"object-spilling-directory\n": "/x"})],
)
def test_a_trailing_newline_is_not_a_valid_name_or_key(field: str, value: object) -> None:
    fields = {"name": "demo", field: value}
    with pytest.raises(SpecError, match=field):
        ClusterSpec(**fields)


@pytest.mark.parametrize(
    "env, why",
    [({"LD_PRELOAD": "/tmp/x.so"}, "dynamic loader"), ({"LD_AUDIT": "x"}, "dynamic loader"),
     ({"PATH": "a\x00b"}, "NUL"), ({"PATH": "a\ud800b"}, "UTF-8")],
)
def test_env_that_would_run_code_or_break_exec_is_refused(env: dict, why: str) -> None:
    with pytest.raises(SpecError, match=why):
        ClusterSpec(name="demo", env=env)


@pytest.mark.parametrize("field", ["spark_conf", "ray_start_options", "env"])
def test_text_utf8_cannot_carry_is_refused_naming_the_field(field: str) -> None:
    # A lone surrogate is what Python makes of bytes that are not UTF-8 (os.environb,
    # surrogateescape): the proto and every process's environment would fail on it later.
    key = {"spark_conf": "spark.x", "ray_start_options": "resources", "env": "A"}[field]
    with pytest.raises(SpecError, match=rf"{field}.*UTF-8") as err:
        ClusterSpec(name="demo", **{field: {key: "bad\udcff"}})
    assert "\\udcff" in str(err.value)  # named, escaped: the message itself is text a terminal prints
    str(err.value).encode("utf-8")  # strict: raises if the bad text reached the message as it was
    if field == "spark_conf":
        with pytest.raises(SpecError, match="UTF-8"):
            ClusterSpec(name="demo", spark_conf={"spark.\ud800": "1"})


def test_spec_proto_round_trip() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from raydist.spec import ClusterSpec, spec_from_proto, spec_to_proto

    @settings(max_examples=60)
    @given(
        workers=st.integers(0, 100), cpus=st.one_of(st.none(), st.integers(1, 64)),
        gpus=st.sampled_from([0.0, 0.5, 1.0, 2.0]), mem=st.one_of(st.none(), st.integers(64 << 20, 1 << 40)),
        env=st.dictionaries(st.from_regex(r"\A[A-Z][A-Z0-9_]{0,8}\Z"),
                            st.text(_UTF8_CHARS, max_size=10), max_size=3),
        heal=st.booleans(), dashboard=st.booleans(),
    )
    def check(workers: int, cpus: int | None, gpus: float, mem: int | None, env: dict[str, str], heal: bool,
              dashboard: bool) -> None:
        env = {k: v for k, v in env.items() if not k.startswith(("RAY_AUTH_", "RAYDIST_")) and k != "LD_AUDIT"}
        spec = ClusterSpec(name="rt", workers=workers, cpus_per_worker=cpus, gpus_per_worker=gpus,
                           memory_per_worker=mem, env=env, self_heal=heal, dashboard=dashboard)
        assert spec_from_proto(spec_to_proto(spec)) == spec

    check()


def test_the_oracle_knows_valid_from_invalid() -> None:
    """The table, against values whose answer a reader can check by eye."""
    from raydist._proto import pb

    assert [name_ok(n) for n in ("a", "ok-1", "a" * 63, "team.ml", "0")] == [True] * 5
    assert not any(name_ok(n) for n in ("", "UPPER", "-lead", "trail-", "a" * 64, "a_b", "a\n", "é", "a.b.c"))
    good = pb.ClusterSpec(name="ok", workers=2, cpus_per_worker=1, memory_per_worker=64 * MIB,
                          env={"MY_VAR": "1"}, ray_start_options={"min-worker-port": "20000"})
    assert spec_errors(good) == set()
    assert spec_errors(pb.ClusterSpec(name="ok", workers=2, max_workers=3)) == {"workers"}
    assert spec_errors(pb.ClusterSpec(name="ok", min_workers=3, max_workers=2)) == {"min_workers"}
    assert spec_errors(pb.ClusterSpec(name="ok", gpus_per_worker=2.5, memory_per_worker=1)) == \
        {"gpus_per_worker", "memory_per_worker"}
    assert spec_errors(pb.ClusterSpec(name="ok", env={"RAYDIST_X": "1"}, ray_start_options={"port": "1"},
                                      start_timeout_s=float("nan"))) == {"env", "ray_start_options",
                                                                         "start_timeout_s"}
