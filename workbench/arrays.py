"""MLX arrays as numpy: the one conversion the engine, routing, traces and analyses share."""

from __future__ import annotations

import mlx.core as mx
import numpy as np


def to_numpy(a, dtype=np.float32) -> np.ndarray:
    """An MLX array (or one already brought to the host) as numpy, through float32 (numpy has no
    bfloat16)."""
    if isinstance(a, np.ndarray):
        return a.astype(dtype, copy=False)
    return np.array(a.astype(mx.float32)).astype(dtype, copy=False)
