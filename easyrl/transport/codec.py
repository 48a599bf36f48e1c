"""Numpy <-> protobuf `Tensor` codec. Raw little-endian bytes, never pickle.

Nested batches (mappings of mappings of arrays) are flattened to names joined
with "/" and rebuilt on decode.
"""

import math
from collections.abc import Iterable, Mapping

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
    array = np.asarray(array)
    if array.dtype.name not in ALLOWED_DTYPES:
        raise TransportError(f"tensor {name!r}: dtype {array.dtype} cannot be sent")
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    data = np.ascontiguousarray(little).tobytes()
    return pb.Tensor(name=name, dtype=array.dtype.name, shape=array.shape, data=data)


def decode_array(tensor: pb.Tensor) -> np.ndarray:
    """Decodes a `Tensor` into a (writable) numpy array.

    Raises:
        TransportError: unknown dtype, negative dimension, a byte count that does
            not match the shape, or a shape numpy cannot represent (too many
            dimensions, or an empty array whose nominal size overflows).
    """
    if tensor.dtype not in ALLOWED_DTYPES:
        raise TransportError(f"tensor {tensor.name!r}: unsupported dtype {tensor.dtype!r}")
    shape = tuple(int(d) for d in tensor.shape)
    if any(d < 0 for d in shape):
        raise TransportError(f"tensor {tensor.name!r}: negative dimension in shape {shape}")
    dtype = np.dtype(tensor.dtype).newbyteorder("<")
    # Python ints: no wrap-around however absurd the shape. The byte count must match
    # the data exactly, so the element count is capped by the message size.
    expected = math.prod(shape) * dtype.itemsize
    if len(tensor.data) != expected:
        raise TransportError(
            f"tensor {tensor.name!r}: {len(tensor.data)} bytes for shape {shape} "
            f"and dtype {tensor.dtype} (expected {expected})"
        )
    try:
        array = np.frombuffer(tensor.data, dtype=dtype).reshape(shape)
    except ValueError as err:
        raise TransportError(f"tensor {tensor.name!r}: bad shape {shape}: {err}") from err
    return array.astype(dtype.newbyteorder("="), copy=True)


def encode_named(arrays: Mapping[str, np.ndarray]) -> list[pb.Tensor]:
    """Encodes a flat {name: array} mapping; names may contain "/" (variable names)."""
    return [encode_array(name, array) for name, array in arrays.items()]


def decode_named(tensors: Iterable[pb.Tensor]) -> dict[str, np.ndarray]:
    """Decodes tensors into a flat {name: array} mapping (no nesting).

    Raises:
        TransportError: a name appears twice, or a tensor does not decode.
    """
    flat = {}
    for tensor in tensors:
        if tensor.name in flat:
            raise TransportError(f"duplicate tensor name {tensor.name!r}")
        flat[tensor.name] = decode_array(tensor)
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


def decode_batch(tensors: Iterable[pb.Tensor]) -> dict:
    """Decodes a list of named `Tensor`s back into a (nested) mapping of arrays."""
    return unflatten(decode_named(tensors))
