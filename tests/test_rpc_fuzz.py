"""Generated requests against a real `raydist serve`: at least 1,000 per RPC.

Each request is built field by field from the RPC's request descriptor, so a
field added to the protos is fuzzed without a change here. The oracle is a
table of each field's valid values written here from the documented rules
(the protos' comments, the README), not the library's validator: a request
with invalid fields is answered INVALID_ARGUMENT naming one of them, any
other is accepted (with the answer a valid request gets); and the server is
still serving at the end. A wrong rule in the library fails here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raydist.engine.node.procs import ray_processes, wait_no_ray_processes
from tests.control_server import Server
from tests.spec_oracle import expect_invalid, name_ok, request_id_ok, spec_errors

pytestmark = pytest.mark.integration

EXAMPLES = 1000
_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

_TEXT = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=70),  # protobuf refuses lone surrogates
    st.sampled_from(["", "a", "ok-1", "UPPER", "-lead", "trail-", "a" * 63, "a" * 64, "a_b", "a\n", "é", "x\x00"]),
)
_INT32 = st.one_of(st.integers(-3, 8), st.integers(-(2**31), 2**31 - 1))
_INT64 = st.one_of(st.integers(-3, 1 << 34), st.integers(-(2**63), 2**63 - 1))
_DOUBLE = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0, -1.0]), st.floats(allow_nan=True, allow_infinity=True))
_SCALARS = {
    FieldDescriptor.TYPE_STRING: _TEXT,
    FieldDescriptor.TYPE_BOOL: st.booleans(),
    FieldDescriptor.TYPE_INT32: _INT32,
    FieldDescriptor.TYPE_INT64: _INT64,
    FieldDescriptor.TYPE_DOUBLE: _DOUBLE,
    FieldDescriptor.TYPE_FLOAT: _DOUBLE.map(lambda x: x if not math.isfinite(x) or abs(x) < 3e38 else 1.0),
}


@st.composite
def messages(draw: st.DrawFn, cls: Any, depth: int = 0) -> Any:
    """One message of ``cls`` with a random subset of its fields set to random values."""
    msg = cls()
    for field in cls.DESCRIPTOR.fields:
        if not draw(st.booleans()):
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            entries = draw(st.dictionaries(_TEXT, _TEXT, max_size=3))
            getattr(msg, field.name).update(entries)
        elif field.message_type is not None:
            if depth < 2:
                getattr(msg, field.name).CopyFrom(draw(messages(_message_class(cls, field), depth + 1)))
        elif field.type == FieldDescriptor.TYPE_ENUM:
            setattr(msg, field.name, draw(st.sampled_from([v.number for v in field.enum_type.values])))
        else:
            setattr(msg, field.name, draw(_SCALARS[field.type]))
    return msg


@st.composite
def near_valid_creates(draw: st.DrawFn) -> Any:
    """A create the oracle should take, with at most one field from the fuzz:
    random messages are almost never valid, and the accepting side of every
    rule needs examples too."""
    from raydist._proto import pb

    spec = pb.ClusterSpec(name=draw(st.sampled_from(["ok", "a-1", "team", "x" * 63])),
                          workers=draw(st.integers(1, 2)), cpus_per_worker=1)
    if draw(st.booleans()):
        fields = draw(messages(pb.ClusterSpec)).ListFields()
        if fields:
            field, value = draw(st.sampled_from(fields))
            one = pb.ClusterSpec()
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                getattr(one, field.name).update(value)
            elif field.message_type is not None:
                getattr(one, field.name).CopyFrom(value)
            else:
                setattr(one, field.name, value)
            if field.name in ("workers", "min_workers", "max_workers"):
                spec.ClearField("workers")
            spec.MergeFrom(one)
    return pb.CreateClusterRequest(spec=spec, request_id=draw(st.sampled_from(["", "r-1", "a" * 129])))


def _message_class(parent: Any, field: FieldDescriptor) -> Any:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(field.message_type)


@pytest.fixture(scope="module")
def server(control_plane: Server) -> Iterator[Server]:
    """The suite's shared control plane; the fuzz leaves it as it found it."""
    before = {p.pid for p in ray_processes()}
    control_plane.wait_serving()  # raw stubs below do not retry a Spark still starting
    yield control_plane
    assert not wait_no_ray_processes(ignore=before)


@pytest.fixture(scope="module")
def known(server: Server) -> list[Any]:
    """The clusters the server knew before the fuzz (other tests' deleted ones)."""
    return list(server.client().list())


@pytest.fixture(scope="module")
def stub(server: Server) -> Iterator[Any]:
    from raydist._proto import rpc

    with grpc.insecure_channel(server.address) as channel:
        yield rpc.ClusterServiceStub(channel)


def _call(server: Server, method: Any, request: Any, stream: bool = False) -> tuple[grpc.StatusCode, str, Any]:
    meta = [("authorization", f"Bearer {server.token}")]
    try:
        if stream:
            calls = method(request, metadata=meta, timeout=3)
            first = next(iter(calls))
            calls.cancel()
            return grpc.StatusCode.OK, "", first
        return grpc.StatusCode.OK, "", method(request, metadata=meta, timeout=60)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or "", None


def test_create(server: Server, stub: Any, known: list[Any]) -> None:
    from raydist._proto import pb

    answers: dict[str, int] = {}

    @_SETTINGS
    @given(request=st.one_of(messages(pb.CreateClusterRequest), near_valid_creates()))
    def check(request: Any) -> None:
        request.validate_only = True  # every check a create makes, nothing started
        bad = spec_errors(request.spec) | (set() if request_id_ok(request.request_id) else {"request_id"})
        code, details, reply = _call(server, stub.CreateCluster, request)
        answers[code.name] = answers.get(code.name, 0) + 1
        if bad:
            expect_invalid(code, details, bad)
        else:
            assert code in (grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED), (code, details)
            if code == grpc.StatusCode.OK:
                assert reply.spec.name == request.spec.name and reply.state == pb.STATE_UNSPECIFIED

    check()
    assert answers.get("INVALID_ARGUMENT", 0) > 0 and answers.get("OK", 0) > 0, answers
    assert sum(answers.values()) >= EXAMPLES, answers
    assert server.client().list() == known  # validate_only created nothing


def _exists(server: Server, stub: Any, name: str) -> bool:
    """Whether the server holds a cluster of that name (in any state)."""
    from raydist._proto import pb

    code, _, _ = _call(server, stub.GetCluster, pb.GetClusterRequest(name=name), stream=False)
    return code == grpc.StatusCode.OK


@pytest.mark.parametrize("rpc_name", ["GetCluster", "DeleteCluster", "WatchCluster", "GetClusterCredentials"])
def test_by_name(server: Server, stub: Any, rpc_name: str) -> None:
    from raydist._proto import pb

    request_cls = getattr(pb, f"{rpc_name}Request")
    count = 0

    @_SETTINGS
    @given(request=messages(request_cls))
    def check(request: Any) -> None:
        nonlocal count
        count += 1
        code, details, _ = _call(server, getattr(stub, rpc_name), request, stream=rpc_name == "WatchCluster")
        if not name_ok(request.name):
            expect_invalid(code, details, {"name"})
        elif rpc_name == "DeleteCluster" and request.allow_missing:
            assert code == grpc.StatusCode.OK, (code, details)
        elif code != grpc.StatusCode.NOT_FOUND and _exists(server, stub, request.name):
            # A cluster an earlier test of this shared server made (Hypothesis
            # also draws the suite's own string constants, "elastic" say): a
            # deleted one is kept a while and still answers. Anything but a
            # crash is an answer about it.
            assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (code, details)
        else:
            assert code == grpc.StatusCode.NOT_FOUND, (code, details)  # no cluster exists here
            assert request.name in details

    check()
    assert count >= EXAMPLES


def test_update(server: Server, stub: Any) -> None:
    from raydist._proto import pb

    updatable = ("workers", "min_workers", "max_workers", "idle_timeout_s")
    paths = st.lists(st.one_of(st.sampled_from(updatable), _TEXT), max_size=3)
    count = 0

    @_SETTINGS
    @given(spec=messages(pb.ClusterSpec), mask=paths)
    def check(spec: Any, mask: list[str]) -> None:
        nonlocal count
        count += 1
        request = pb.UpdateClusterRequest(spec=spec, update_mask={"paths": mask})
        code, details, _ = _call(server, stub.UpdateCluster, request)
        if not name_ok(spec.name):
            return expect_invalid(code, details, {"spec.name"})
        if not mask or any(p not in updatable for p in mask):
            return expect_invalid(code, details, {"update_mask"})
        unset = {p for p in mask if p != "idle_timeout_s" and not spec.HasField(p)}  # a count asked, none given
        if unset:
            return expect_invalid(code, details, unset)
        assert code == grpc.StatusCode.NOT_FOUND, (code, details)  # no cluster exists here

    check()
    assert count >= EXAMPLES


def test_node_logs(server: Server, stub: Any) -> None:
    from raydist._proto import pb

    count = 0

    @_SETTINGS
    @given(request=messages(pb.GetNodeLogsRequest))
    def check(request: Any) -> None:
        nonlocal count
        count += 1
        code, details, _ = _call(server, stub.GetNodeLogs, request)
        kept = bool(request.run)  # a teardown's kept files: any node or none, read whole
        bad = {field for field, ok in (("name", name_ok(request.name)),
                                       ("node", len(request.node) <= 64 and (kept or request.node)),
                                       ("offset", request.offset == 0 if kept else request.offset >= 0),
                                       ("max_bytes", 0 <= request.max_bytes <= 1 << 20),
                                       ("grep", len(request.grep) <= 200 and "\n" not in request.grep),
                                       ("run", len(request.run) <= 32)) if not ok}
        if bad:
            expect_invalid(code, details, bad)
        else:  # no cluster exists here, and none ever kept logs
            assert code == grpc.StatusCode.NOT_FOUND and request.name in details, (code, details)

    check()
    assert count >= EXAMPLES


def test_set_dashboard(server: Server, stub: Any) -> None:
    from raydist._proto import pb

    count = 0

    @_SETTINGS
    @given(request=messages(pb.SetDashboardRequest))
    def check(request: Any) -> None:
        nonlocal count
        count += 1
        code, details, _ = _call(server, stub.SetDashboard, request)
        if not name_ok(request.name):
            expect_invalid(code, details, {"name"})
        else:  # no cluster exists here
            assert code == grpc.StatusCode.NOT_FOUND and request.name in details, (code, details)

    check()
    assert count >= EXAMPLES


def test_list_and_server_info(server: Server, stub: Any, known: list[Any]) -> None:
    from raydist._proto import pb

    count = 0

    @_SETTINGS
    @given(listing=messages(pb.ListClustersRequest), info=messages(pb.GetServerInfoRequest))
    def check(listing: Any, info: Any) -> None:
        nonlocal count
        count += 1
        code, details, reply = _call(server, stub.ListClusters, listing)
        if not 0 <= listing.page_size <= 1000:
            assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("page_size"), (code, details)
        elif listing.page_token and not name_ok(listing.page_token):
            assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("page_token"), (code, details)
        else:
            after = [c for c in known if c.spec.name > listing.page_token][:listing.page_size or 100]
            assert code == grpc.StatusCode.OK and list(reply.clusters) == after, (code, details)
        code, details, reply = _call(server, stub.GetServerInfo, info)
        assert code == grpc.StatusCode.OK and reply.version, (code, details)

    check()
    assert count >= EXAMPLES


def test_the_server_still_serves_after_the_fuzz(server: Server) -> None:
    assert server.proc is not None and server.proc.poll() is None
    assert server.client().server_info().version
    log = Path(server.home / "test-server.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    assert json.loads((server.home / "server.json").read_text())["pid"] == server.proc.pid
