#!/usr/bin/env bash
# The engine's GPU checks, on a machine with MLX's CUDA (or Metal) build installed (see
# ../shared/gpu/README.md for the lent H200): the engine tests with WORKBENCH_DEVICE=gpu, the NaN
# probe, and the engine / read-path / cold-streaming benchmarks. Logs go to $OUT (default ./gpu-out).
#   bash scripts/gpu.sh tests|bench|all
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 WORKBENCH_DEVICE=gpu
what=${1:-all}
if [ "$what" = nan ]; then  # is the sporadic NaN MLX's buffer reuse? the same tests with its buffer cache off
  for limit in default 0; do
    if [ "$limit" = default ]; then unset WORKBENCH_MLX_CACHE_LIMIT; else export WORKBENCH_MLX_CACHE_LIMIT=$limit; fi
    timeout 170 python3 -m pytest tests/test_policy_layer.py tests/test_engine_exact.py -q -p no:cacheprovider \
      -o faulthandler_timeout=100 -k "not cli" 2>&1 | tee "$OUT/tests-cache-$limit.txt" | tail -n 3
  done
  unset WORKBENCH_MLX_CACHE_LIMIT
  timeout 110 python3 bench/bench_engine.py --device gpu --tokens 64 --reps 3 --arenas 1.0,0.25 --decode auto,layer \
    2>&1 | tee "$OUT/bench_ref.txt"
  timeout 100 python3 bench/bench_engine.py --mid --device gpu --tokens 48 --reps 3 --arenas 1.0,0.25 --decode auto,layer \
    2>&1 | tee "$OUT/bench_mid.txt"
fi
if [ "$what" = probe ]; then
  timeout 120 python3 bench/slot_probe.py --device gpu 2>&1 | tee "$OUT/slot_probe.txt"
  timeout 200 python3 -m pytest tests/test_engine_exact.py tests/test_policy_layer.py tests/test_hooks_trace.py -q -x \
    -p no:cacheprovider -o faulthandler_timeout=100 -k "not cli" 2>&1 | tee "$OUT/tests.txt" | tail -n 40
  timeout 150 python3 bench/bench_engine.py --device gpu --tokens 64 --reps 3 --arenas 1.0,0.25 --decode auto,layer \
    2>&1 | tee "$OUT/bench_ref.txt"
  timeout 100 python3 bench/bench_engine.py --mid --device gpu --tokens 48 --reps 3 --arenas 1.0 --decode auto \
    2>&1 | tee "$OUT/bench_mid.txt"
fi
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
  python3 -c 'import mlx.core as mx, mlx_lm; print("mlx", mx.__version__, "mlx-lm", mlx_lm.__version__, mx.default_device())'; } > "$OUT/env.txt" 2>&1
if [ "$what" = tests ] || [ "$what" = all ]; then
  timeout 150 python3 bench/nan_probe.py --device gpu --runs 4 --processes 3 --tokens 32 2>&1 | tee "$OUT/nan.txt"
  timeout 330 python3 -m pytest tests/test_engine_exact.py tests/test_policy_layer.py tests/test_hooks_trace.py \
    tests/test_reference_engine.py -q -p no:cacheprovider -o faulthandler_timeout=120 -k "not cli" 2>&1 \
    | tee "$OUT/tests.txt" | tail -n 60
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  timeout 200 python3 bench/bench_engine.py --device gpu --tokens 64 --reps 3 --arenas 1.0,0.5,0.25 \
    --decode auto,layer --writes staged,direct 2>&1 | tee "$OUT/bench_ref.txt"
  timeout 200 python3 bench/bench_engine.py --mid --device gpu --tokens 48 --reps 3 --arenas 1.0,0.25 \
    --decode auto,layer 2>&1 | tee "$OUT/bench_mid.txt"
  timeout 60 python3 bench/bench_readpath.py --device gpu --slot-writes-only --reps 3 2>&1 | tee "$OUT/readpath.txt"
  timeout 90 python3 bench/bench_cold.py --device gpu --mode direct --tokens 24 --reps 2 2>&1 | tee "$OUT/cold.txt"
fi
