"""Speed of `workbench simulate` (virtual time through the engine's arena).

    python bench/bench_simulate.py [--tokens 64] [--repeat 3]

A synthetic Zipf trace (16 layers x 64 experts, top-8, a d1 predictor column), arena 0.25,
LRU, 1 MiB experts; simulate without read-ahead and with the d1 predictor. Prints the median
wall time and lookups/s of each. Run it from another checkout (PYTHONPATH=that checkout,
``python -c`` on this file's body) to compare versions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.config import AheadConfig, ArenaConfig  # noqa: E402
from workbench.trace.synthetic import synthetic_trace  # noqa: E402
from workbench.sim.vtime import Timing, simulate  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    path = Path(tempfile.mkdtemp()) / "s.parquet"
    synthetic_trace(path, n_tokens=a.tokens, n_layers=16, n_experts=64, top_k=8, kind="zipf", predictors=(1,))
    for pred in (None, "d1"):
        times = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            res = simulate(path, ArenaConfig("0.25"), AheadConfig(pred), timing=Timing(expert_bytes=1 << 20))
            times.append(time.perf_counter() - t0)
        med, s = statistics.median(times), res.summary
        print(f"predictor {pred or 'none'}: {s['lookups']} lookups, median {med * 1e3:.0f} ms, "
              f"{s['lookups'] / med / 1e3:.1f} k lookups/s (hits {s['hits']}, sync misses {s['sync_misses']}, "
              f"prefetches {s['prefetch']['issued']})")


if __name__ == "__main__":
    main()
