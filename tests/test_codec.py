"""Tests of easyrl.transport.codec (numpy <-> Tensor) and of the generated protobuf modules."""

import pickle
import subprocess
import sys

import numpy as np
import pytest

from easyrl.errors import TransportError
from easyrl.transport import codec, generate
from easyrl.transport import easyrl_pb2 as pb

DTYPES = sorted(codec.ALLOWED_DTYPES)


def sample(dtype_name: str, shape=(3, 4), seed: int = 0) -> np.ndarray:
    """An array of `dtype_name` with varied values, including the dtype's extremes."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype_name)
    size = int(np.prod(shape))
    if dtype.kind == "b":
        values = rng.integers(0, 2, size=size).astype(bool)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, size=size, dtype=dtype, endpoint=True)
        extremes = np.array([info.min, info.max, 0, 1], dtype=dtype)[:size]
        values[: len(extremes)] = extremes
    else:
        values = (rng.standard_normal(size) * 100).astype(dtype)
        specials = np.array([np.inf, -np.inf, -0.0, np.finfo(dtype).max], dtype=dtype)[:size]
        values[: len(specials)] = specials
    return values.reshape(shape)


def round_trip(array: np.ndarray, name: str = "x") -> np.ndarray:
    return codec.decode_array(codec.encode_array(name, array))


def assert_identical(out: np.ndarray, expected: np.ndarray) -> None:
    """Same shape, same dtype name, native byte order, and bit-identical values."""
    assert out.shape == expected.shape
    assert out.dtype.name == expected.dtype.name
    assert out.dtype.isnative
    native = expected.astype(expected.dtype.newbyteorder("="))
    assert out.tobytes() == np.ascontiguousarray(native).tobytes()
    assert np.array_equal(out, expected)


# --- round trips -------------------------------------------------------------------------


def test_allowed_dtypes_are_the_plain_numeric_ones():
    assert codec.ALLOWED_DTYPES == {
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    }


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_dtype(dtype):
    array = sample(dtype)
    tensor = codec.encode_array("x", array)
    assert tensor.name == "x"
    assert tensor.dtype == dtype
    assert list(tensor.shape) == [3, 4]
    assert len(tensor.data) == array.nbytes
    assert_identical(codec.decode_array(tensor), array)


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_zero_d_scalar(dtype):
    scalar = sample(dtype, shape=(4,), seed=1)[1].reshape(())
    tensor = codec.encode_array("s", scalar)
    assert list(tensor.shape) == []
    out = codec.decode_array(tensor)
    assert out.ndim == 0
    assert_identical(out, scalar)


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_numpy_scalar_object(dtype):
    scalar = np.dtype(dtype).type(1)
    out = round_trip(scalar)
    assert out.shape == () and out.dtype.name == dtype and out == scalar


@pytest.mark.parametrize("shape", [(0,), (3, 0, 2), (0, 0)])
@pytest.mark.parametrize("dtype", ["bool", "uint8", "float16", "int64"])
def test_round_trip_empty_arrays(dtype, shape):
    array = np.zeros(shape, dtype=dtype)
    tensor = codec.encode_array("e", array)
    assert tensor.data == b""
    assert tuple(tensor.shape) == shape
    assert_identical(codec.decode_array(tensor), array)


@pytest.mark.parametrize("dtype", ["bool", "uint8", "float16", "int64", "float64"])
def test_round_trip_non_contiguous_views(dtype):
    base = sample(dtype, shape=(6, 8), seed=2)
    views = [base.T, base[::2, ::-3], base[:, 1], np.broadcast_to(base[0], (5, 8))]
    for view in views:
        assert not view.flags.c_contiguous
        out = round_trip(view)
        assert out.flags.c_contiguous
        assert_identical(out, view)


@pytest.mark.parametrize("dtype", ["int16", "int64", "uint16", "uint32", "float16", "float64"])
def test_round_trip_big_endian_input(dtype):
    little = sample(dtype, seed=3)
    big = little.astype(np.dtype(dtype).newbyteorder(">"))
    assert big.dtype.byteorder == ">"
    tensor = codec.encode_array("b", big)
    assert tensor.dtype == dtype
    # The wire format is little-endian no matter what the input byte order was.
    assert tensor.data == little.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    out = codec.decode_array(tensor)
    assert out.dtype == np.dtype(dtype)
    assert_identical(out, little)


def test_wire_bytes_are_raw_little_endian_not_pickle(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("pickle must not be used by the codec")

    for name in ("dumps", "loads", "dump", "load"):
        monkeypatch.setattr(pickle, name, forbidden)
    array = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    tensor = codec.encode_array("w", array)
    assert tensor.data == array.astype("<f4").tobytes()
    assert tensor.data == b"".join(np.array(v, dtype="<f4").tobytes() for v in array.flat)
    assert not tensor.data.startswith(b"\x80")  # pickle protocol 2+ header
    for value, dtype in [(258, "<i4"), (1.5, "<f8"), (True, "|b1"), (7, "<u2")]:
        encoded = codec.encode_array("v", np.array([value], dtype=dtype))
        assert encoded.data == np.array([value], dtype=dtype).tobytes()
    assert codec.encode_array("i", np.array([1, 256], dtype="<i2")).data == b"\x01\x00\x00\x01"
    assert_identical(codec.decode_array(tensor), array)


def test_decode_of_hand_built_tensor():
    tensor = pb.Tensor(name="h", dtype="int32", shape=[2], data=b"\x01\x00\x00\x00\xff\xff\xff\xff")
    out = codec.decode_array(tensor)
    assert out.dtype == np.int32
    assert out.tolist() == [1, -1]


def test_decoded_arrays_are_read_only_views():
    # Views of the received bytes, never copies: a receiver that writes copies first.
    array = np.arange(6, dtype=np.int64).reshape(2, 3)
    tensor = codec.encode_array("x", array)
    first = codec.decode_array(tensor)
    assert not first.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        first[0, 0] = 100
    body = codec.Body()
    framed = body.frame(pb.PullResponse(tensors=body.named({"x": array, "y": array[:, 0]})))
    data = framed.SerializeToString()
    reply = codec.parser(pb.PullResponse)(data)
    decoded = codec.decode_named(reply.tensors, reply.body)
    assert_identical(decoded["x"], array)
    assert_identical(decoded["y"], array[:, 0])
    assert np.shares_memory(decoded["x"], np.frombuffer(data, np.uint8))
    assert not decoded["x"].flags.writeable


def test_encoding_does_not_modify_the_input():
    array = np.arange(5, dtype=">f4")
    copy = array.copy()
    codec.encode_array("x", array)
    assert array.dtype.byteorder == ">"
    assert array.tobytes() == copy.tobytes()


# --- nested batches -----------------------------------------------------------------------


def make_batch() -> dict:
    return {
        "obs": sample("uint8", shape=(4, 3, 2), seed=4),
        "done": np.array([True, False, False, True]),
        "extras": {
            "logits": sample("float32", shape=(4, 5), seed=5),
            "value": sample("float16", shape=(4,), seed=6),
            "deeper": {"step": np.arange(4, dtype=np.int64)},
        },
    }


def assert_same_batch(out, expected) -> None:
    assert isinstance(out, dict)
    assert set(out) == set(expected)
    for key, value in expected.items():
        if isinstance(value, dict):
            assert_same_batch(out[key], value)
        else:
            assert isinstance(out[key], np.ndarray)
            assert_identical(out[key], value)


def test_batch_names_are_flattened_with_slashes():
    tensors = codec.encode_batch(make_batch())
    assert all(isinstance(t, pb.Tensor) for t in tensors)
    assert sorted(t.name for t in tensors) == [
        "done",
        "extras/deeper/step",
        "extras/logits",
        "extras/value",
        "obs",
    ]


def test_batch_round_trip():
    batch = make_batch()
    assert_same_batch(codec.decode_batch(codec.encode_batch(batch)), batch)


def test_batch_round_trip_through_serialized_message():
    batch = make_batch()
    priorities = np.array([1.0, 0.5, 2.0, 0.25])
    request = pb.InsertRequest(
        tensors=codec.encode_batch(batch),
        priorities=codec.encode_array("priorities", priorities),
        actor=3,
    )
    wire = request.SerializeToString()
    assert isinstance(wire, bytes)
    received = pb.InsertRequest.FromString(wire)
    assert received.actor == 3
    assert_same_batch(codec.decode_batch(received.tensors), batch)
    assert_identical(codec.decode_array(received.priorities), priorities)


def test_batch_round_trip_in_sample_response():
    batch = {"obs": np.ones((2, 3), np.float32), "action": np.array([1, 0], np.int32)}
    response = pb.SampleResponse(
        ready=True,
        tensors=codec.encode_batch(batch),
        keys=codec.encode_array("keys", np.array([7, 9], np.int64)),
        weights=codec.encode_array("weights", np.array([1.0, 0.5], np.float32)),
    )
    received = pb.SampleResponse.FromString(response.SerializeToString())
    assert_same_batch(codec.decode_batch(received.tensors), batch)
    assert codec.decode_array(received.keys).tolist() == [7, 9]


def test_empty_batch_round_trip():
    assert codec.encode_batch({}) == []
    assert codec.decode_batch([]) == {}


def test_flatten_unflatten_inverse():
    batch = make_batch()
    flat = codec.flatten(batch)
    assert set(flat) == {"obs", "done", "extras/logits", "extras/value", "extras/deeper/step"}
    assert flat["extras/logits"] is batch["extras"]["logits"]
    assert_same_batch(codec.unflatten(flat), batch)


# --- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "array",
    [
        np.array([1, "a", None], dtype=object),
        np.array(["ab", "c"]),
        np.array([b"ab", b"c"]),
        np.zeros(2, dtype="V4"),
        np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")]),
        np.zeros(2, dtype=np.complex64),
        np.zeros(2, dtype="datetime64[s]"),
    ],
    ids=["object", "str", "bytes", "void", "structured", "complex", "datetime"],
)
def test_encode_refuses_non_numeric_dtypes(array):
    with pytest.raises(TransportError, match="cannot be sent"):
        codec.encode_array("bad", array)
    with pytest.raises(TransportError):
        codec.encode_batch({"ok": np.zeros(1), "nested": {"bad": array}})


def test_encode_refuses_python_object_list():
    with pytest.raises(TransportError):
        codec.encode_array("bad", [1, "two", object()])


@pytest.mark.parametrize(
    ("dtype", "shape", "nbytes"),
    [
        ("float32", [2, 3], 20),
        ("float32", [2, 3], 28),
        ("float32", [2, 3], 0),
        ("int64", [], 4),
        ("uint8", [0], 1),
        ("bool", [5], 4),
        ("float16", [3], 3),
    ],
)
def test_decode_refuses_data_length_mismatch(dtype, shape, nbytes):
    tensor = pb.Tensor(name="t", dtype=dtype, shape=shape, data=b"\x00" * nbytes)
    with pytest.raises(TransportError, match="bytes for shape"):
        codec.decode_array(tensor)


@pytest.mark.parametrize("shape", [[-1], [2, -3], [-2, -3]])
def test_decode_refuses_negative_dimension(shape):
    tensor = pb.Tensor(name="t", dtype="uint8", shape=shape, data=b"\x00" * 6)
    with pytest.raises(TransportError, match="negative dimension"):
        codec.decode_array(tensor)


@pytest.mark.parametrize(
    "dtype", ["", "float128", "complex64", "object", "str", "f4", "<f4", "Float32", "void"]
)
def test_decode_refuses_unknown_dtype(dtype):
    tensor = pb.Tensor(name="t", dtype=dtype, shape=[1], data=b"\x00" * 4)
    with pytest.raises(TransportError, match="unsupported dtype"):
        codec.decode_array(tensor)


@pytest.mark.parametrize(
    ("shape", "nbytes"),
    [
        ([2**32, 2**32], 0),  # int64 product wraps to exactly 0
        ([2**62, 4], 0),  # int64 product wraps to 0 too
        ([2**63 - 1, 2**63 - 1], 4),  # wraps to 1 element = 4 bytes with int64
        ([0, 2**62], 0),  # zero elements, but numpy refuses the shape
        ([0, 2**63 - 1, 2**63 - 1], 0),
        ([1] * 65, 4),  # more dimensions than numpy supports
    ],
    ids=["wraps-to-zero", "wraps-to-zero-2", "wraps-to-one", "too-big", "too-big-3d", "65-dims"],
)
def test_decode_refuses_absurd_shapes_with_transport_error(shape, nbytes):
    tensor = pb.Tensor(name="t", dtype="float32", shape=shape, data=b"\x00" * nbytes)
    with pytest.raises(TransportError, match="'t'"):
        codec.decode_array(tensor)


def test_decode_of_large_empty_shape_that_numpy_accepts():
    tensor = pb.Tensor(name="t", dtype="float64", shape=[2**32, 0], data=b"")
    out = codec.decode_array(tensor)
    assert out.shape == (2**32, 0) and out.dtype == np.float64 and out.size == 0


def test_decode_refuses_shape_whose_byte_size_exceeds_the_data():
    # 2**40 float32 elements announced, 16 bytes given: refused before any allocation.
    tensor = pb.Tensor(name="t", dtype="float32", shape=[2**20, 2**20], data=b"\x00" * 16)
    with pytest.raises(TransportError, match="bytes for shape"):
        codec.decode_array(tensor)


def test_decode_batch_refuses_duplicate_names():
    tensors = [
        codec.encode_array("x", np.zeros(2)),
        codec.encode_array("y", np.zeros(2)),
        codec.encode_array("x", np.ones(2)),
    ]
    with pytest.raises(TransportError, match="duplicate"):
        codec.decode_batch(tensors)


@pytest.mark.parametrize(
    "batch",
    [{"a/b": np.zeros(1)}, {"a": {"b/c": np.zeros(1)}}, {"/": np.zeros(1)}],
    ids=["top", "nested", "bare"],
)
def test_encode_batch_refuses_separator_in_key(batch):
    with pytest.raises(TransportError, match="may not contain"):
        codec.encode_batch(batch)


@pytest.mark.parametrize(
    "batch",
    [{1: np.zeros(1)}, {"a": {2.5: np.zeros(1)}}, {None: np.zeros(1)}, {b"a": np.zeros(1)}],
    ids=["int", "nested-float", "none", "bytes"],
)
def test_flatten_refuses_non_string_keys(batch):
    with pytest.raises(TransportError, match="not a string"):
        codec.flatten(batch)
    with pytest.raises(TransportError, match="not a string"):
        codec.encode_batch(batch)


@pytest.mark.parametrize("names", [("a", "a/b"), ("a/b", "a"), ("x/a", "x/a/b/c")])
def test_decode_batch_refuses_prefix_conflict(names):
    tensors = [codec.encode_array(name, np.zeros(1, np.float32)) for name in names]
    with pytest.raises(TransportError):
        codec.decode_batch(tensors)


# --- generated modules --------------------------------------------------------------------


def generate_out_of_process(out_dir) -> None:
    """Runs `generate.generate(out_dir)` in a fresh interpreter.

    grpc_tools' in-process protoc segfaults once TensorFlow is loaded in the same process
    (both bundle libprotobuf), and any test module that imports TensorFlow loads it at
    collection time, so protoc must not run inside the pytest process.
    """
    code = "import sys; from easyrl.transport import generate; generate.generate(sys.argv[1])"
    result = subprocess.run(
        [sys.executable, "-c", code, str(out_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"generate failed ({result.returncode}):\n{result.stderr}"


@pytest.mark.cluster
def test_generated_modules_are_current(tmp_path):
    generate_out_of_process(tmp_path)
    for name in generate.GENERATED:
        fresh = (tmp_path / name).read_bytes()
        committed = (generate.HERE / name).read_bytes()
        assert fresh == committed, (
            f"easyrl/transport/{name} is stale relative to easyrl.proto: "
            "run `python -m easyrl.transport.generate` and commit the result"
        )


@pytest.mark.cluster
def test_generated_grpc_module_imports_its_sibling_relatively(tmp_path):
    generate_out_of_process(tmp_path)
    text = (tmp_path / "easyrl_pb2_grpc.py").read_text()
    assert "from . import easyrl_pb2 as" in text
    assert "\nimport easyrl_pb2 as" not in text


# --- tensors in the message body ----------------------------------------------------------


def _framed_insert() -> tuple[bytes, dict, np.ndarray]:
    batch = {
        "obs": np.arange(24, dtype=np.uint8).reshape(2, 3, 4),
        "reward": np.array([0.5, -1.0], np.float32),
        "empty": np.zeros((2, 0), np.float64),
        "nested": {"x": np.array([[1, 2], [3, 4]], np.int64)},
    }
    priorities = np.array([1.0, 2.0])
    body = codec.Body()
    request = pb.InsertRequest(tensors=body.batch(batch), actor=3)
    request.priorities.CopyFrom(body.tensor("priorities", priorities))
    return body.frame(request).SerializeToString(), batch, priorities


def test_framed_message_round_trips_through_both_parsers():
    data, batch, priorities = _framed_insert()
    fast = codec.parser(pb.InsertRequest)(data)
    plain = pb.InsertRequest.FromString(data)  # any protobuf client reads it too
    assert isinstance(fast, codec.Received) and bytes(fast.body) == plain.body
    for message in (fast, plain):
        assert message.actor == 3
        assert_same_batch(codec.decode_batch(message.tensors, message.body), batch)
        assert_identical(codec.decode_array(message.priorities, message.body), priorities)


def _with_body_field(header: bytes, body: bytes) -> bytes:
    return header + pb.InsertRequest(body=body).SerializeToString()


@pytest.mark.parametrize("layout", ["body-first", "body-twice", "no-body", "body-varint"])
def test_parser_agrees_with_protobuf_on_odd_layouts(layout):
    data, _, _ = _framed_insert()
    plain = pb.InsertRequest.FromString(data)
    header = pb.InsertRequest(tensors=plain.tensors, priorities=plain.priorities, actor=3)
    header_bytes = header.SerializeToString()
    payload = {
        "body-first": _with_body_field(b"", plain.body) + header_bytes,
        "body-twice": _with_body_field(_with_body_field(header_bytes, b"junk"), plain.body),
        "no-body": header_bytes,
        "body-varint": header_bytes + bytes([15 << 3 | 0, 7]),  # wrong wire type: unknown
    }[layout]
    fast = codec.parser(pb.InsertRequest)(payload)
    expected = pb.InsertRequest.FromString(payload)
    assert bytes(fast.body) == expected.body
    rest, want = pb.InsertRequest(), pb.InsertRequest()
    rest.CopyFrom(fast.message if isinstance(fast, codec.Received) else fast)
    want.CopyFrom(expected)
    rest.ClearField("body")
    want.ClearField("body")
    assert rest == want
    if layout in ("body-first", "body-twice"):
        assert codec.decode_array(fast.priorities, fast.body).tolist() == [1.0, 2.0]


def test_parser_of_a_message_without_body_is_protobufs():
    assert codec.parser(pb.StatusRequest) == pb.StatusRequest.FromString


def test_flat_vector_of_decoded_tensors_is_a_view_of_the_message():
    import tensorflow as tf

    from easyrl.models.flat import FlatVariables

    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.float32)}
    flat = FlatVariables([tf.Variable(v) for v in arrays.values()])
    body = codec.Body()
    data = body.frame(pb.PushRequest(gradients=body.named(arrays))).SerializeToString()
    reply = codec.parser(pb.PushRequest)(data)
    decoded = codec.decode_named(reply.gradients, reply.body)
    joined = flat.concat([decoded["a"], decoded["b"]])
    assert np.shares_memory(joined, np.frombuffer(data, np.uint8))  # no copy
    assert joined.tolist() == [0, 1, 2, 3, 4, 5, 1, 1, 1, 1]
    swapped = flat.concat([decoded["b"], decoded["a"]])  # not in buffer order: a copy
    assert not np.shares_memory(swapped, np.frombuffer(data, np.uint8))
    assert swapped.tolist() == [1, 1, 1, 1, 0, 1, 2, 3, 4, 5]
