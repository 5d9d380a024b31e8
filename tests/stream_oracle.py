"""The synthetic federation's documented standard normals, computed independently of the
package (the oracle of ``tests/data``'s stream tests)."""

from __future__ import annotations

import statistics

import numpy as np


def quantile_normals_oracle(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` standard normals as the stream documents them, computed independently: raw 64-bit
    words, each split into four 16-bit indices from its low bits up, each index ``i`` the normal
    quantile of ``(i + 1/2) / 2^16`` rounded to float32."""
    words = rng.bit_generator.random_raw(-(-n // 4)).tolist()
    index = [(w >> (16 * j)) & 0xFFFF for w in words for j in range(4)][:n]
    dist = statistics.NormalDist()
    return np.array([dist.inv_cdf((i + 0.5) / 65536) for i in index], dtype=np.float32)
