"""Numpy buffers on an `ALIGN`-byte boundary: memory TensorFlow reads in place (a request body
read out of shared memory, `easyrl.transport.shm`; a compiled call's inputs,
`easyrl.models.flat.as_tensor`)."""

import numpy as np

ALIGN = 64
"""What TensorFlow needs of memory it reads in place (Eigen's widest vectors): unaligned, the
first kernel that reads it aborts the process."""


def aligned_empty(nbytes: int) -> np.ndarray:
    """An uninitialized uint8 buffer of `nbytes` bytes starting on an `ALIGN` boundary."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + nbytes]
