"""Numpy <-> protobuf `Tensor` codec. Raw little-endian bytes, never pickle.

Nested batches (mappings of mappings of arrays) are flattened to names joined
with "/" and rebuilt on decode.

Two ways for a tensor's bytes to travel:

- inline, in `Tensor.data` (`encode_array`, `encode_named`, `encode_batch`): a plain protobuf
  message, what a hand-made request uses. Protobuf copies the bytes on every step (into the
  message, out of it, into the wire buffer, back into a message, out of it again).
- in the message's `body` (`Body`): the tensors carry an `offset` into one raw buffer, which
  `Framed.SerializeToString` appends to the serialized metadata as field 15 of the message
  (still valid protobuf, one copy), and which `parser`'s deserializer slices off the wire bytes
  before protobuf parses the small rest, so that `decode_array` returns views into the bytes
  gRPC received (no copy at all). What every role sends.

Decoded arrays are views of the bytes they arrived in: read-only over gRPC's bytes, writable
over a body read out of a caller's shared memory (`easyrl.transport.shm`), which is the
receiver's own copy; a receiver that writes into one copies it first.
"""

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from easyrl.errors import TransportError
from easyrl.transport import easyrl_pb2 as pb

# Only plain numeric dtypes travel: object, string and void arrays are refused.
ALLOWED_DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64".split()
)
SEPARATOR = "/"


def encode_array(name: str, array: np.ndarray) -> pb.Tensor:
    """Encodes one numpy array as a `Tensor`.

    Raises:
        TransportError: the dtype cannot travel (object, strings, ...).
    """
    array, little = _wire_layout(name, array)
    return pb.Tensor(name=name, dtype=array.dtype.name, shape=array.shape, data=little.tobytes())


def _wire_layout(name: str, array: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(`array` as an ndarray, its bytes as they travel: C-contiguous little-endian, a view
    when it already is; at least 1-D, so take the shape from the first).

    Raises:
        TransportError: the dtype cannot travel (object, strings, ...).
    """
    array = np.asarray(array)
    if array.dtype.name not in ALLOWED_DTYPES:
        raise TransportError(f"tensor {name!r}: dtype {array.dtype} cannot be sent")
    return array, np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<"), copy=False))


def decode_array(tensor: pb.Tensor, body: Any = b"") -> np.ndarray:
    """Decodes a `Tensor` (inline, or at its `offset` in its message's `body`) into a
    read-only numpy array that shares the received bytes.

    Raises:
        TransportError: unknown dtype, negative dimension, a byte count that does
            not match the shape, an offset outside `body`, or a shape numpy cannot represent
            (too many dimensions, or an empty array whose nominal size overflows).
    """
    if tensor.dtype not in ALLOWED_DTYPES:
        raise TransportError(f"tensor {tensor.name!r}: unsupported dtype {tensor.dtype!r}")
    shape = tuple(int(d) for d in tensor.shape)
    if any(d < 0 for d in shape):
        raise TransportError(f"tensor {tensor.name!r}: negative dimension in shape {shape}")
    dtype = np.dtype(tensor.dtype).newbyteorder("<")
    # Python ints: no wrap-around however absurd the shape. The byte count must match
    # the data exactly, so the element count is capped by the message size.
    count = math.prod(shape)
    expected = count * dtype.itemsize
    if tensor.HasField("offset"):
        offset, data = tensor.offset, tensor.data
        if data or offset < 0 or offset + expected > len(body):
            raise TransportError(
                f"tensor {tensor.name!r}: {expected} bytes at offset {offset} do not lie in "
                f"the message body of {len(body)} bytes (or the tensor has inline data too)"
            )
        buffer = body
    else:
        offset, buffer = 0, tensor.data
        if len(buffer) != expected:
            raise TransportError(
                f"tensor {tensor.name!r}: {len(buffer)} bytes for shape {shape} "
                f"and dtype {tensor.dtype} (expected {expected})"
            )
    try:
        if count:
            array = np.frombuffer(buffer, dtype=dtype, count=count, offset=offset)
        else:  # frombuffer refuses an empty buffer
            array = np.empty(0, dtype)
        array = array.reshape(shape)
    except ValueError as err:
        raise TransportError(f"tensor {tensor.name!r}: bad shape {shape}: {err}") from err
    if not dtype.isnative:
        array = array.astype(dtype.newbyteorder("="))
        array.flags.writeable = False
    return array


def encode_named(arrays: Mapping[str, np.ndarray]) -> list[pb.Tensor]:
    """Encodes a flat {name: array} mapping; names may contain "/" (variable names)."""
    return [encode_array(name, array) for name, array in arrays.items()]


def decode_named(tensors: Iterable[pb.Tensor], body: Any = b"") -> dict[str, np.ndarray]:
    """Decodes tensors (of a message whose `body` is `body`) into a flat {name: array}
    mapping (no nesting).

    Raises:
        TransportError: a name appears twice, or a tensor does not decode.
    """
    flat = {}
    for tensor in tensors:
        if tensor.name in flat:
            raise TransportError(f"duplicate tensor name {tensor.name!r}")
        flat[tensor.name] = decode_array(tensor, body)
    return flat


def flatten(batch: Mapping, prefix: str = "") -> dict[str, np.ndarray]:
    """Flattens a nested mapping of arrays into {"a/b": array}.

    Raises:
        TransportError: a key is not a string, or contains "/".
    """
    flat = {}
    for key, value in batch.items():
        if not isinstance(key, str):
            where = f" under {prefix.removesuffix(SEPARATOR)!r}" if prefix else ""
            raise TransportError(f"key {key!r}{where} is not a string")
        if SEPARATOR in key:
            raise TransportError(f"key {key!r} may not contain {SEPARATOR!r}")
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + SEPARATOR))
        else:
            flat[name] = value
    return flat


def unflatten(flat: Mapping[str, np.ndarray]) -> dict:
    """Inverse of `flatten`."""
    nested: dict = {}
    for name, value in flat.items():
        *parents, leaf = name.split(SEPARATOR)
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise TransportError(f"tensor {name!r} conflicts with a tensor of its prefix")
        if leaf in node:
            raise TransportError(f"duplicate tensor name {name!r}")
        node[leaf] = value
    return nested


def encode_batch(batch: Mapping) -> list[pb.Tensor]:
    """Encodes a (nested) mapping of arrays as a list of named `Tensor`s."""
    return encode_named(flatten(batch))


def decode_batch(tensors: Iterable[pb.Tensor], body: Any = b"") -> dict:
    """Decodes a list of named `Tensor`s (of a message whose `body` is `body`) back into a
    (nested) mapping of arrays."""
    return unflatten(decode_named(tensors, body))


# --- tensors in the message body ---------------------------------------------------------

BODY_FIELD = 15
"""Field number of `body` in every message that carries tensors (easyrl.proto)."""
_BODY_KEY = bytes([BODY_FIELD << 3 | 2])  # field 15, wire type 2 (length-delimited)


def _put_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _get_varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it); raises IndexError/ValueError on truncated or long varints."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 64:
            raise ValueError("varint too long")


class Body:
    """Collects the tensors of one message as raw buffers (no copy yet) and hands out their
    `Tensor` metadata with offsets; `frame(message)` pairs a message with them. A Body may
    frame several messages (a PS shard reuses one per version for every Pull)."""

    def __init__(self) -> None:
        self.parts: list[memoryview] = []
        self.size = 0

    def tensor(self, name: str, array: np.ndarray) -> pb.Tensor:
        """Adds `array`; returns its metadata (`offset` into the body).

        Raises:
            TransportError: the dtype cannot travel.
        """
        array, little = _wire_layout(name, array)
        tensor = pb.Tensor(name=name, dtype=array.dtype.name, shape=array.shape, offset=self.size)
        if little.nbytes:
            # numpy arrays export the buffer protocol; numpy's stubs do not declare it.
            self.parts.append(memoryview(little).cast("B"))  # pyright: ignore[reportArgumentType]
            self.size += little.nbytes
        return tensor

    def named(self, arrays: Mapping[str, np.ndarray]) -> list[pb.Tensor]:
        """Adds a flat {name: array} mapping."""
        return [self.tensor(name, array) for name, array in arrays.items()]

    def batch(self, batch: Mapping) -> list[pb.Tensor]:
        """Adds a (nested) mapping of arrays (names joined with "/")."""
        return self.named(flatten(batch))

    def frame(self, message) -> "Framed":
        """`message` (whose tensors came from this body) with the body attached."""
        return Framed(message, self)


class Framed:
    """A message and the body its tensors point into: what a role sends. gRPC serializes it
    with `SerializeToString` (the generated stubs and servicers too); its fields read through
    to the message, and `body` joins the buffers (for in-process callers such as tests)."""

    __slots__ = ("message", "_body", "_bytes")

    def __init__(self, message, body: Body):
        self.message, self._body = message, body
        self._bytes: bytes | None = None

    def SerializeToString(self) -> bytes:  # noqa: N802 (protobuf's name)
        """The wire bytes, built once (a PS shard answers every Pull of a version with the
        same reply)."""
        if self._bytes is None:
            header = self.message.SerializeToString()
            size = _put_varint(self._body.size)
            self._bytes = b"".join([header, _BODY_KEY, size, *self._body.parts])
        return self._bytes

    @property
    def body(self) -> bytes:
        return b"".join(self._body.parts)

    def body_parts(self) -> tuple[list[memoryview], int]:
        """The body's buffers (no copy) and their size in bytes."""
        return self._body.parts, self._body.size

    def __getattr__(self, name: str):
        return getattr(self.message, name)


class Received:
    """A message parsed without its `body`, which stays a view of the received bytes;
    fields read through to the message."""

    __slots__ = ("message", "body")

    def __init__(self, message, body: memoryview):
        self.message, self.body = message, body

    def __getattr__(self, name: str):
        return getattr(self.message, name)


def split_body(data: bytes) -> tuple[bytes, memoryview] | None:
    """Splits serialized message bytes into (the bytes of every other field, a view of the
    one `body` field's contents) by walking the top-level fields; None when there is no body
    field, more than one, or the bytes do not walk as protobuf (the caller then parses the
    whole message, which decides what is valid)."""
    found, pos, end, start = None, 0, len(data), 0
    try:
        while pos < end:
            key, after = _get_varint(data, pos)
            wire = key & 7
            if wire == 0:
                _, after = _get_varint(data, after)
            elif wire == 1:
                after += 8
            elif wire == 5:
                after += 4
            elif wire == 2:
                length, start = _get_varint(data, after)
                after = start + length
            else:
                return None
            if after > end:
                return None
            if key >> 3 == BODY_FIELD:
                if wire != 2 or found is not None:
                    return None
                found = (pos, start, after)
            pos = after
    except (IndexError, ValueError):
        return None
    if found is None:
        return None
    field, start, stop = found
    return data[:field] + data[stop:], memoryview(data)[start:stop]


def parser(message_type) -> Callable[[bytes], Any]:
    """The gRPC deserializer of `message_type`: for messages with a `body`, parses the rest
    and keeps the body as a view of the received bytes (`Received`)."""
    if "body" not in message_type.DESCRIPTOR.fields_by_name:
        return message_type.FromString

    def parse(data: bytes):
        split = split_body(data)
        if split is None:
            return message_type.FromString(data)
        header, body = split
        return Received(message_type.FromString(header), body)

    return parse
