"""Fuzzing every RPC of the PS and memory shards from a raw gRPC client.

One PS shard and one memory shard per replay table kind (uniform, prioritized,
trajectory FIFO, aggregate) are served in this process the way the roles serve them
and given some state (assigned and pushed values, a report, inserted items). Each case
then sends one malformed request, as raw bytes through a generic gRPC call carrying the
run's token, and checks the answer's status code, that the shard still answers Status,
and that everything it holds is unchanged (see `RoleServers.state`).

Garbage that protobuf cannot parse is refused by gRPC itself with INTERNAL ("Exception
deserializing request!") before any handler runs; a request that parses but is invalid
is refused by the handler with INVALID_ARGUMENT. Tensors are fuzzed both inline and with
their bytes in the message body (offsets), the layout roles send.
"""

import math

import grpc
import numpy as np
import pytest
from google.protobuf.message import DecodeError

from easyrl.transport import codec, rpc
from easyrl.transport import easyrl_pb2 as pb

TOKEN = "fuzz-test-token"
KINDS = ("uniform", "prioritized", "trajectory", "aggregate")
REPLAY = ("uniform", "prioritized")
INVALID = grpc.StatusCode.INVALID_ARGUMENT
OK = grpc.StatusCode.OK

PS_VALUES = {
    "q/dense/w": np.arange(6, dtype=np.float32).reshape(2, 3) / 10,
    "q/dense/b": np.array([0.5, -0.5, 1.5], np.float32),
}
PS_GRADS = {name: np.full_like(value, 0.25) for name, value in PS_VALUES.items()}

SERVICES = {"ps": "ParameterServer", "memory": "ReplayMemory"}


def _requests(service: str) -> dict:
    """{method: request class} of every RPC of `service` in easyrl.proto (a new one is
    fuzzed too)."""
    methods = pb.DESCRIPTOR.services_by_name[service].methods
    return {m.name: getattr(pb, m.input_type.name) for m in methods}


REQUESTS = {role: _requests(service) for role, service in SERVICES.items()}


class RawClient:
    """Generic unary calls carrying raw bytes (no stub, no serializer) and the token."""

    def __init__(self, address: str, token: str):
        self.channel = grpc.insecure_channel(address)
        self.metadata = (("authorization", f"Bearer {token}"),)

    def call(self, service: str, method: str, payload: bytes) -> tuple[grpc.StatusCode, str]:
        """Sends `payload` as the request of `method`; returns (status code, details)."""
        rpc = self.channel.unary_unary(
            f"/easyrl.v1.{service}/{method}", request_serializer=None, response_deserializer=None
        )
        try:
            rpc(payload, timeout=10.0, metadata=self.metadata)
        except grpc.RpcError as err:
            return err.code(), err.details()
        return OK, ""


@pytest.fixture(scope="module")
def shards(role_servers):
    """{kind: Shards} with state: the PS shards hold assigned values pushed once and a
    report; replay tables hold a wrapped ring, the FIFO some unrolls (and a prefetched
    batch), the aggregate table part of round 0."""
    started = {kind: role_servers.start(role_servers.config(kind), TOKEN) for kind in KINDS}
    for kind, shard in started.items():
        ps, memory = shard.ctx.client("ps", 0), shard.ctx.client("memory", 0)
        ps.call("Assign", pb.AssignRequest(tensors=codec.encode_named(PS_VALUES)))
        ps.call("Push", pb.PushRequest(version=1, gradients=codec.encode_named(PS_GRADS)))
        report = pb.ReportRequest(
            role="actor", task=0, env_steps=10, episode_returns=[3.0], episode_lengths=[7]
        )
        ps.call("Report", report)
        spec = shard.memory.table.spec
        if kind in REPLAY:
            insert = pb.InsertRequest(tensors=codec.encode_batch(role_servers.items(spec, 0, 20)))
            insert.priorities.CopyFrom(codec.encode_array("p", np.linspace(0.5, 2.0, 20)))
            memory.call("Insert", insert)
            update = pb.UpdatePrioritiesRequest(
                keys=codec.encode_array("keys", np.array([5, 17])),
                priorities=codec.encode_array("priorities", np.array([4.0, 0.1])),
            )
            memory.call("UpdatePriorities", update)
        else:
            insert = pb.InsertRequest(
                tensors=codec.encode_batch(role_servers.items(spec, 0, 5)), round=0
            )
            memory.call("Insert", insert)
        ps.close()
        memory.close()
        role_servers.settled_state(shard.memory)
    assert started["aggregate"].memory.table.size == 5  # round 0 (8 items) is not complete
    assert started["trajectory"].memory.table.size == 3  # 2 unrolls wait in the prefetch
    return started


@pytest.fixture(scope="module")
def raw(shards):
    """{(role, kind): RawClient}."""
    clients = {}
    for kind, shard in shards.items():
        for role in SERVICES:
            address = getattr(shard.ctx.cluster, role)[0]
            clients[role, kind] = RawClient(address, TOKEN)
    yield clients
    for client in clients.values():
        client.channel.close()


def check_refused(role_servers, shards, raw, role, kind, method, payload, code) -> str:
    """Sends `payload`; asserts the `code` answer, a live shard and an unchanged state.
    Returns the status details."""
    servicer = getattr(shards[kind], role)
    client = raw[role, kind]
    before = role_servers.state(servicer)
    got, details = client.call(SERVICES[role], method, payload)
    assert got == code, f"{method}: {got} {details!r}"
    assert client.call(SERVICES[role], "Status", b"")[0] == OK
    assert role_servers.state(servicer) == before, f"{method} changed the shard"
    return details


# --- garbage bytes ------------------------------------------------------------------------

METHODS = [(role, method) for role, methods in REQUESTS.items() for method in methods]


@pytest.mark.parametrize("length", [1, 3, 16, 256, 4096])
@pytest.mark.parametrize(("role", "method"), METHODS, ids=[f"{r}.{m}" for r, m in METHODS])
def test_random_bytes_are_refused(role_servers, shards, raw, role, method, length):
    payload = np.random.default_rng(length).bytes(length)
    with pytest.raises(DecodeError):  # garbage to protobuf as well: no handler may run
        REQUESTS[role][method].FromString(payload)
    code = grpc.StatusCode.INTERNAL  # gRPC's "Exception deserializing request!"
    for kind in KINDS if role == "memory" else ("prioritized",):
        check_refused(role_servers, shards, raw, role, kind, method, payload, code)


DEFAULT_REQUEST_CODES = [
    ("ps", "Pull", OK),  # a read
    ("ps", "Push", INVALID),
    ("ps", "Assign", INVALID),
    ("ps", "Report", INVALID),
    ("ps", "PublishRound", INVALID),  # round 0
    ("ps", "Status", OK),
    ("memory", "Insert", INVALID),
    ("memory", "Sample", INVALID),
    ("memory", "UpdatePriorities", INVALID),
    ("memory", "Status", OK),
]


@pytest.mark.parametrize(
    ("role", "method", "code"),
    DEFAULT_REQUEST_CODES,
    ids=[f"{r}.{m}" for r, m, _ in DEFAULT_REQUEST_CODES],
)
def test_empty_request(role_servers, shards, raw, role, method, code):
    """b"" parses as a request with every field at its default: only reads succeed."""
    # An aggregate table's Sample of round 0 with no timeout is a legitimate poll.
    kinds = REPLAY + ("trajectory",) if method == "Sample" else KINDS
    for kind in kinds if role == "memory" else ("prioritized",):
        check_refused(role_servers, shards, raw, role, kind, method, b"", code)


def test_every_method_but_shutdown_has_an_empty_request_case():
    cases = {(role, method) for role, method, _ in DEFAULT_REQUEST_CODES}
    assert cases == {(r, m) for r, m in METHODS if m != "Shutdown"}


# --- malformed tensors --------------------------------------------------------------------


def _set(**fields):
    """Sets fields of the first tensor; a callable value gets the old shape (for `shape`) or
    the tensor (for the others)."""

    def mutate(tensors):
        first = pb.Tensor()
        first.CopyFrom(tensors[0])
        for key, value in fields.items():
            if key == "shape":
                del first.shape[:]
                first.shape.extend(value(list(first.shape)) if callable(value) else value)
            else:
                setattr(first, key, value(first) if callable(value) else value)
        return [first, *tensors[1:]]

    return mutate


def _recast(dtype):
    """The first tensor well encoded, in another dtype."""

    def mutate(tensors):
        array = codec.decode_array(tensors[0]).astype(dtype)
        return [codec.encode_array(tensors[0].name, array), *tensors[1:]]

    return mutate


def _with(extra):
    """Appends `extra(first tensor)`."""

    def mutate(tensors):
        return [*tensors, extra(tensors[0])]

    return mutate


def _permuted(shape: list[int]) -> list[int]:
    """The same element count in another layout: reversed (1-D: a trailing 1 added)."""
    return shape + [1] if len(shape) == 1 else shape[::-1]


def _renamed(name):
    return lambda t: pb.Tensor(name=name, dtype=t.dtype, shape=t.shape, data=t.data)


TENSOR_MUTATIONS = {
    "dtype-object": _set(dtype="object"),
    "dtype-float128": _set(dtype="float128"),
    "dtype-empty": _set(dtype=""),
    "dtype-complex64": _set(dtype="complex64"),
    "dtype-byteorder-string": _set(dtype="<f4"),
    "dtype-str": _set(dtype="str"),
    "dtype-void": _set(dtype="V4"),
    "dtype-upper-case": _set(dtype="FLOAT32"),
    "dtype-20000-chars": _set(dtype="f" * 20_000),  # echoed: past gRPC's 16 KiB metadata
    "dtype-float64-recast": _recast(np.float64),
    "dtype-int32-recast": _recast(np.int32),
    "dtype-relabelled-float64": _set(dtype="float64"),
    "shape-permuted": _set(shape=_permuted),
    "shape-extra-dim": _set(shape=lambda s: [*s, 1]),
    "shape-flat": _set(shape=lambda s: [math.prod(s)] + ([1] if len(s) == 1 else [])),
    "shape-scalar": _set(shape=[], data=lambda t: t.data[: np.dtype(t.dtype).itemsize]),
    "shape-huge": _set(shape=[2**40, 2**40]),
    "shape-huge-overflowing": _set(shape=[2**62, 2**62, 2**62]),
    "shape-huge-empty": _set(shape=[0, 2**62], data=b""),
    "shape-100-dims": _set(shape=[1] * 100, data=lambda t: t.data[: np.dtype(t.dtype).itemsize]),
    "shape-negative": _set(shape=lambda s: [-1, *s[1:]]),
    "shape-two-negatives": _set(
        shape=[-2, -3], data=lambda t: t.data[: 6 * np.dtype(t.dtype).itemsize]
    ),
    "shape-int64-min": _set(shape=[-(2**63)]),
    "bytes-one-more": _set(data=lambda t: t.data + b"\0"),
    "bytes-one-less": _set(data=lambda t: t.data[:-1]),
    "bytes-none": _set(data=b""),
    "name-empty": _set(name=""),
    "name-unknown": _set(name="no/such/tensor"),
    "name-20000-chars": _set(name="n" * 20_000),
    "name-nested-under-first": _with(lambda t: _renamed(f"{t.name}/x")(t)),
    "name-duplicate": _with(lambda t: t),
    "name-extra": _with(_renamed("extra")),
    "missing-first": lambda tensors: tensors[1:],
    "none": lambda tensors: [],
}


def _in_body(tensors) -> tuple[list, bytes]:
    """The same tensors with their bytes moved into a message body (what roles send)."""
    moved, parts, size = [], [], 0
    for tensor in tensors:
        copy = pb.Tensor()
        copy.CopyFrom(tensor)
        copy.ClearField("data")
        copy.offset = size
        parts.append(tensor.data)
        size += len(tensor.data)
        moved.append(copy)
    return moved, b"".join(parts)


# Tensor mutations that mean the same with the bytes in the body (a byte count is not a
# property of a tensor there: the shape says how many bytes it reads at its offset).
BODY_TENSOR_MUTATIONS = [m for m in TENSOR_MUTATIONS if not m.startswith("bytes-")]

BODY_MUTATIONS = {
    "offset-negative": lambda tensors, body: (_set(offset=-1)(tensors), body),
    "offset-at-end": lambda tensors, body: (_set(offset=len(body))(tensors), body),
    "offset-int64-max": lambda tensors, body: (_set(offset=2**63 - 1)(tensors), body),
    "body-one-byte-short": lambda tensors, body: (tensors, body[:-1]),
    "body-missing": lambda tensors, body: (tensors, b""),
    "offset-and-inline-data": lambda tensors, body: (_set(data=b"\0")(tensors), body),
}


def _body_cases():
    for mutation in BODY_TENSOR_MUTATIONS:
        mutate = TENSOR_MUTATIONS[mutation]
        yield mutation, lambda tensors, mutate=mutate: _in_body(mutate(tensors))
    for mutation, mutate in BODY_MUTATIONS.items():
        yield f"body-{mutation}", lambda tensors, mutate=mutate: mutate(*_in_body(tensors))


BODY_CASES = dict(_body_cases())


@pytest.mark.parametrize("case", BODY_CASES)
@pytest.mark.parametrize("method", ["Push", "Assign"])
def test_ps_malformed_tensors_in_body(role_servers, shards, raw, method, case):
    if method == "Push":
        tensors, body = BODY_CASES[case](codec.encode_named(PS_GRADS))
        version = shards["prioritized"].ps.version
        request = pb.PushRequest(version=version, gradients=tensors, body=body)
    else:
        tensors, body = BODY_CASES[case](
            codec.encode_named({k: v + 1 for k, v in PS_VALUES.items()})
        )
        request = pb.AssignRequest(tensors=tensors, body=body)
    payload = request.SerializeToString()
    check_refused(role_servers, shards, raw, "ps", "prioritized", method, payload, INVALID)


@pytest.mark.parametrize("case", BODY_CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_insert_malformed_tensors_in_body(role_servers, shards, raw, kind, case):
    spec = shards[kind].memory.table.spec
    tensors, body = BODY_CASES[case](codec.encode_batch(role_servers.items(spec, 100, 3)))
    payload = pb.InsertRequest(tensors=tensors, body=body).SerializeToString()
    check_refused(role_servers, shards, raw, "memory", kind, "Insert", payload, INVALID)


@pytest.mark.parametrize("mutation", TENSOR_MUTATIONS)
@pytest.mark.parametrize("method", ["Push", "Assign"])
def test_ps_malformed_tensors(role_servers, shards, raw, method, mutation):
    mutate = TENSOR_MUTATIONS[mutation]
    if method == "Push":  # against the current version: only the tensors are wrong
        version = shards["prioritized"].ps.version
        request = pb.PushRequest(version=version, gradients=mutate(codec.encode_named(PS_GRADS)))
    else:  # overwriting the values
        values = {k: v + 1 for k, v in PS_VALUES.items()}
        request = pb.AssignRequest(tensors=mutate(codec.encode_named(values)))
    payload = request.SerializeToString()
    check_refused(role_servers, shards, raw, "ps", "prioritized", method, payload, INVALID)


def _insert(batch, **fields) -> bytes:
    return pb.InsertRequest(tensors=codec.encode_batch(batch), **fields).SerializeToString()


@pytest.mark.parametrize("mutation", TENSOR_MUTATIONS)
@pytest.mark.parametrize("kind", KINDS)
def test_insert_malformed_tensors(role_servers, shards, raw, kind, mutation):
    spec = shards[kind].memory.table.spec
    tensors = TENSOR_MUTATIONS[mutation](codec.encode_batch(role_servers.items(spec, 100, 3)))
    payload = pb.InsertRequest(tensors=tensors).SerializeToString()
    check_refused(role_servers, shards, raw, "memory", kind, "Insert", payload, INVALID)


@pytest.mark.parametrize("field", ["dtype", "name"])
def test_refusals_echo_a_bounded_part_of_the_input(role_servers, shards, raw, field):
    tensors = _set(**{field: "x" * 20_000})(codec.encode_named(PS_GRADS))
    request = pb.PushRequest(version=shards["prioritized"].ps.version, gradients=tensors)
    payload = request.SerializeToString()
    details = check_refused(
        role_servers, shards, raw, "ps", "prioritized", "Push", payload, INVALID
    )
    assert "xxxx" in details and len(details) <= rpc.DETAILS_LIMIT + 40, len(details)


def _int_column_as_float32(batch):
    return {**batch, "action": batch["action"].astype(np.float32)}


def _ragged(batch):
    return {**batch, "action": batch["action"][:-1]}


def _no_items(batch):
    return {k: v[:0] for k, v in batch.items()}


@pytest.mark.parametrize("bad", [_int_column_as_float32, _ragged, _no_items])
@pytest.mark.parametrize("kind", KINDS)
def test_insert_bad_batch(role_servers, shards, raw, kind, bad):
    spec = shards[kind].memory.table.spec
    payload = _insert(bad(role_servers.items(spec, 100, 3)))
    check_refused(role_servers, shards, raw, "memory", kind, "Insert", payload, INVALID)


@pytest.mark.parametrize("kind", ["trajectory", "aggregate"])
def test_insert_larger_than_the_table(role_servers, shards, raw, kind):
    """More items than the table can ever hold at once (a replay ring keeps the newest)."""
    table = shards[kind].memory.table
    payload = _insert(role_servers.items(table.spec, 100, table.capacity + 1))
    details = check_refused(role_servers, shards, raw, "memory", kind, "Insert", payload, INVALID)
    assert str(table.capacity) in details


@pytest.mark.parametrize(
    "priorities",
    [
        np.array([1.0, np.nan, 1.0]),
        np.array([1.0, np.inf, 1.0]),
        np.array([-np.inf, 1.0, 1.0]),
        np.array([1.0, -0.5, 1.0]),
        np.ones(2),
        np.ones(4),
        np.ones((3, 1)),
        np.ones((), np.float32),
    ],
    ids=["nan", "inf", "-inf", "negative", "too-few", "too-many", "2-D", "scalar"],
)
@pytest.mark.parametrize("kind", KINDS)
def test_insert_bad_priorities(role_servers, shards, raw, kind, priorities):
    spec = shards[kind].memory.table.spec
    request = pb.InsertRequest(tensors=codec.encode_batch(role_servers.items(spec, 100, 3)))
    request.priorities.CopyFrom(codec.encode_array("priorities", priorities))
    payload = request.SerializeToString()
    check_refused(role_servers, shards, raw, "memory", kind, "Insert", payload, INVALID)


@pytest.mark.parametrize("kind", ["trajectory", "aggregate"])
def test_insert_priorities_to_a_table_without_priorities(role_servers, shards, raw, kind):
    spec = shards[kind].memory.table.spec
    request = pb.InsertRequest(tensors=codec.encode_batch(role_servers.items(spec, 100, 3)))
    request.priorities.CopyFrom(codec.encode_array("priorities", np.ones(3)))
    payload = request.SerializeToString()
    check_refused(role_servers, shards, raw, "memory", kind, "Insert", payload, INVALID)


@pytest.mark.parametrize("round_", [-1, -(2**63)])
def test_insert_negative_round(role_servers, shards, raw, round_):
    spec = shards["aggregate"].memory.table.spec
    payload = _insert(role_servers.items(spec, 100, 3), round=round_)
    check_refused(role_servers, shards, raw, "memory", "aggregate", "Insert", payload, INVALID)


# --- Sample / UpdatePriorities ------------------------------------------------------------

SAMPLE_CASES = {
    "batch-zero": {"batch_size": 0},
    "batch-negative": {"batch_size": -1},
    "batch-int32-min": {"batch_size": -(2**31)},
    "batch-over-capacity": {"batch_size": 17},
    "batch-int32-max": {"batch_size": 2**31 - 1},
    "timeout-negative": {"timeout_s": -1.0},
    "timeout-nan": {"timeout_s": math.nan},
    "timeout-inf": {"timeout_s": math.inf},
    "timeout-over-600": {"timeout_s": 601.0},
}


@pytest.mark.parametrize("case", SAMPLE_CASES)
@pytest.mark.parametrize("kind", ["uniform", "prioritized", "trajectory"])
def test_sample_bad_request(role_servers, shards, raw, kind, case):
    fields = {"batch_size": 2, "timeout_s": 0.1, **SAMPLE_CASES[case]}
    payload = pb.SampleRequest(**fields).SerializeToString()
    check_refused(role_servers, shards, raw, "memory", kind, "Sample", payload, INVALID)


ROUND_SAMPLE_CASES = {
    "round-negative": {"round": -1},
    "round-int64-min": {"round": -(2**63)},
    "batch-negative": {"batch_size": -4},
    "batch-positive": {"batch_size": 4},  # a round is taken whole
    "timeout-nan": {"timeout_s": math.nan},
    "timeout-negative": {"timeout_s": -1.0},
    "timeout-over-600": {"timeout_s": 601.0},
}


@pytest.mark.parametrize("case", ROUND_SAMPLE_CASES)
def test_sample_bad_round_request(role_servers, shards, raw, case):
    fields = {"round": 0, "timeout_s": 0.1, **ROUND_SAMPLE_CASES[case]}
    payload = pb.SampleRequest(**fields).SerializeToString()
    check_refused(role_servers, shards, raw, "memory", "aggregate", "Sample", payload, INVALID)


def _update(keys, priorities) -> bytes:
    request = pb.UpdatePrioritiesRequest(
        keys=codec.encode_array("keys", np.asarray(keys)),
        priorities=codec.encode_array("priorities", np.asarray(priorities)),
    )
    return request.SerializeToString()


UPDATE_CASES = {
    "key-never-issued": ([10, 20], [1.0, 1.0]),  # 20 items inserted: keys 0..19
    "key-huge": ([10, 2**62], [1.0, 1.0]),
    "key-negative": ([10, -1], [1.0, 1.0]),
    "key-int64-min": ([-(2**63)], [1.0]),
    "key-uint64-max": (np.array([2**64 - 1], np.uint64), [1.0]),
    "key-float": (np.array([10.0, 11.0]), [1.0, 1.0]),
    "key-bool": (np.array([True]), [1.0]),
    "key-2-D": ([[10, 11]], [[1.0, 1.0]]),
    "priority-nan": ([10, 11], [1.0, np.nan]),
    "priority-inf": ([10, 11], [np.inf, 1.0]),
    "priority-negative": ([10, 11], [1.0, -1.0]),
    "priority-too-few": ([10, 11], [1.0]),
    "priority-too-many": ([10, 11], [1.0, 1.0, 1.0]),
    "priority-2-D": ([10, 11], [[1.0, 1.0]]),
}


@pytest.mark.parametrize("case", UPDATE_CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_update_priorities_bad_request(role_servers, shards, raw, kind, case):
    payload = _update(*UPDATE_CASES[case])
    method = "UpdatePriorities"
    check_refused(role_servers, shards, raw, "memory", kind, method, payload, INVALID)


# The mutations that break a tensor on its own (a renamed key tensor is still the keys).
TENSOR_ONLY_MUTATIONS = [
    m
    for m in TENSOR_MUTATIONS
    if m.startswith(("dtype-", "shape-", "bytes-")) and "recast" not in m
]


@pytest.mark.parametrize("mutation", [*TENSOR_ONLY_MUTATIONS, "left-out"])
@pytest.mark.parametrize("field", ["keys", "priorities"])
def test_update_priorities_malformed_tensor(role_servers, shards, raw, field, mutation):
    request = pb.UpdatePrioritiesRequest()
    for name, value in (("keys", np.array([10, 11])), ("priorities", np.float32([2, 3]))):
        tensor = codec.encode_array(name, value)
        if name == field and mutation == "left-out":
            continue
        if name == field:
            (tensor,) = TENSOR_MUTATIONS[mutation]([tensor])
        getattr(request, name).CopyFrom(tensor)
    payload = request.SerializeToString()
    method = "UpdatePriorities"
    check_refused(role_servers, shards, raw, "memory", "prioritized", method, payload, INVALID)


@pytest.mark.parametrize("kind", ["trajectory", "aggregate"])
def test_update_priorities_of_a_table_without_priorities(role_servers, shards, raw, kind):
    payload = _update([0, 1], [1.0, 1.0])
    method = "UpdatePriorities"
    check_refused(role_servers, shards, raw, "memory", kind, method, payload, INVALID)


# --- PS: Pull / Push / Assign / Report ----------------------------------------------------

PULL_CASES = {
    "min-round-negative": {"min_round": -1},
    "min-round-int64-min": {"min_round": -(2**63)},
    "wait-negative": {"wait_s": -1.0},
    "wait-nan": {"wait_s": math.nan},
    "wait-inf": {"wait_s": math.inf},
    "wait-over-600": {"wait_s": 601.0},
}


@pytest.mark.parametrize("case", PULL_CASES)
def test_pull_bad_request(role_servers, shards, raw, case):
    payload = pb.PullRequest(known_version=-1, **PULL_CASES[case]).SerializeToString()
    check_refused(role_servers, shards, raw, "ps", "prioritized", "Pull", payload, INVALID)


@pytest.mark.parametrize("version", [0, -1, -(2**63)])
def test_push_version_out_of_range(role_servers, shards, raw, version):
    request = pb.PushRequest(version=version, gradients=codec.encode_named(PS_GRADS))
    payload = request.SerializeToString()
    check_refused(role_servers, shards, raw, "ps", "prioritized", "Push", payload, INVALID)


@pytest.mark.parametrize("only_if_empty", [False, True])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_assign_non_finite_values(role_servers, shards, raw, bad, only_if_empty):
    values = {k: v.copy() for k, v in PS_VALUES.items()}
    values["q/dense/b"][1] = bad
    request = pb.AssignRequest(tensors=codec.encode_named(values), only_if_empty=only_if_empty)
    payload = request.SerializeToString()
    check_refused(role_servers, shards, raw, "ps", "prioritized", "Assign", payload, INVALID)


REPORT_CASES = {
    "env-steps-negative": {"env_steps": -1},
    "updates-int64-min": {"updates": -(2**63)},
    "return-nan": {"episode_returns": [1.0, math.nan], "episode_lengths": [3, 4]},
    "return-inf": {"episode_returns": [math.inf]},
    "return-minus-inf": {"episode_returns": [-math.inf]},
    "eval-return-nan": {"eval_returns": [math.nan]},
    "lengths-too-few": {"episode_returns": [1.0, 2.0], "episode_lengths": [3]},
    "lengths-too-many": {"episode_returns": [1.0], "episode_lengths": [3, 4]},
    "length-negative": {"episode_returns": [1.0], "episode_lengths": [-3]},
    "no-role": {"role": "", "env_steps": 5},
    "unknown-role": {"role": "ps", "env_steps": 5},
    "task-negative": {"task": -1, "env_steps": 5},
}


@pytest.mark.parametrize("case", REPORT_CASES)
def test_report_bad_request(role_servers, shards, raw, case):
    fields = {"role": "actor", "task": 0, **REPORT_CASES[case]}
    payload = pb.ReportRequest(**fields).SerializeToString()
    check_refused(role_servers, shards, raw, "ps", "prioritized", "Report", payload, INVALID)


@pytest.mark.parametrize("round_", [0, -1, -(2**63)])
@pytest.mark.parametrize("kind", ["prioritized", "aggregate"])
def test_publish_round_bad_request(role_servers, shards, raw, kind, round_):
    payload = pb.PublishRoundRequest(round=round_).SerializeToString()
    check_refused(role_servers, shards, raw, "ps", kind, "PublishRound", payload, INVALID)


def test_shards_still_serve_after_the_fuzz(role_servers, shards):
    """The shards fuzzed above still do their work for a well-formed client."""
    for shard in shards.values():
        ps = shard.ctx.client("ps", 0)
        version = shard.ps.version
        reply = ps.call(
            "Push", pb.PushRequest(version=version, gradients=codec.encode_named(PS_GRADS))
        )
        assert reply.applied and reply.version == version + 1
        ps.close()
    memory = shards["prioritized"].ctx.client("memory", 0)
    reply = memory.call("Sample", pb.SampleRequest(batch_size=3, timeout_s=2.0))
    assert reply.ready and codec.decode_array(reply.keys, reply.body).shape == (3,)
    memory.close()
