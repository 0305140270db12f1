"""MLX arrays as numpy, and buffers' addresses: conversions the engine, I/O, routing, traces and
analyses share."""

from __future__ import annotations

import mlx.core as mx
import numpy as np


def to_numpy(a, dtype=np.float32) -> np.ndarray:
    """An MLX array (or one already brought to the host) as numpy, through float32 (numpy has no
    bfloat16)."""
    if isinstance(a, np.ndarray):
        return a.astype(dtype, copy=False)
    return np.array(a.astype(mx.float32)).astype(dtype, copy=False)


def address(buffer) -> int:
    """The address of a buffer's first byte (a memoryview, mmap, MLX array...)."""
    return np.frombuffer(buffer, dtype=np.uint8).ctypes.data
