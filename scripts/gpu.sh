#!/usr/bin/env bash
# The engine's GPU checks, on a machine with MLX's CUDA (or Metal) build installed (see
# ../shared/gpu/README.md for the lent H200). Logs go to $OUT (default ./gpu-out).
#   bash scripts/gpu.sh tests   slot / determinism probe, then the engine tests with WORKBENCH_DEVICE=gpu
#   bash scripts/gpu.sh bench   engine benchmarks (reference and mid-size model) with host profiles,
#                               read path, cold streaming, the arena's own cost per claim, a per-layer
#                               token's host time by function, and one layer's round trip by primitive
#   bash scripts/gpu.sh nan     the NaN probe (resident mlx-lm and the engine, repeated)
#   bash scripts/gpu.sh kernels the GPU kernels per decode token, resident mlx-lm vs the engine (needs torch)
#   bash scripts/gpu.sh handshake  the handshake's tests, its round trip beside a sync, and the engine with it
#                               (the token launched at once, or each layer as built) and without it
#   bash scripts/gpu.sh traced  hooks and traces under the handshake: their tests, then the trace recorder's cost at 25%
#   bash scripts/gpu.sh writes  slot writes staged against mapped at 25%: the handshake's tests, the GPU's kernels
#                               per mid token, and the engine on the mid-size and the reference model
#   bash scripts/gpu.sh wide    the wide model (2.6 MB experts) at 25% staged, greedy and sampled: the engine beside
#                               resident mlx-lm, then py-spy samples of each side's decoding thread (NATIVE=1: C++
#                               frames too). Needs py-spy and zlib-ng: carry their wheels in a call after the
#                               install (with the MLX wheel's third part they pass the 64 MiB carry limit)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 WORKBENCH_DEVICE=gpu
what=${1:-tests}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
  python3 -c 'import mlx.core as mx, mlx_lm; print("mlx", mx.__version__, "mlx-lm", mlx_lm.__version__, mx.default_device())'; } > "$OUT/env.txt" 2>&1
TESTS=${TESTS:-tests/test_engine_exact.py tests/test_handshake_host.py tests/test_policy_layer.py tests/test_hooks_trace.py tests/test_reference_engine.py tests/test_generate.py tests/test_speculative.py}
if [ "$what" = tests ]; then
  timeout ${PROBE_S:-100} python3 bench/slot_probe.py --device gpu 2>&1 | tee "$OUT/slot_probe.txt"
  timeout ${TESTS_S:-400} python3 -m pytest $TESTS -p no:cacheprovider -o faulthandler_timeout=120 -k "not cli" \
    2>&1 | tee "$OUT/tests.txt" | tail -n 40
  echo "pytest exit status ${PIPESTATUS[0]} (124: ran past TESTS_S)" | tee -a "$OUT/tests.txt"
fi
if [ "$what" = handshake ]; then
  timeout 240 python3 -m pytest tests/test_engine_exact.py tests/test_handshake_host.py tests/test_generate.py \
    -p no:cacheprovider -o faulthandler_timeout=90 -k "handshake or one_result or gives_up or given_up or host or sampled_stream" \
    2>&1 | tee "$OUT/hs_tests.txt" | tail -n 5
  timeout 60 python3 bench/bench_sync.py --device gpu --tokens 32 --reps 3 2>&1 | tee "$OUT/sync.txt" | tail -n 4
  timeout ${BENCH_S:-200} python3 bench/bench_engine.py --device gpu --tokens ${TOKENS:-48} --reps 3 \
    --arenas ${ARENAS:-0.25,0.5} --decode layer,auto --handshake token,layer,off 2>&1 | tee "$OUT/hs_ref.txt"
  [ "${MID:-1}" = 1 ] && timeout ${BENCH_S:-200} python3 bench/bench_engine.py --mid --device gpu --tokens 32 --reps 3 \
    --arenas 0.25 --decode layer,auto --handshake token,layer,off 2>&1 | tee "$OUT/hs_mid.txt"
fi
if [ "$what" = writes ]; then
  timeout 200 python3 -m pytest tests/test_engine_exact.py -p no:cacheprovider -o faulthandler_timeout=90 \
    -k "handshake or gives_up" 2>&1 | tee "$OUT/hs_tests.txt" | tail -n 5
  timeout 150 python3 bench/gpu_kernels.py --mid --tokens 16 --arenas 0.25 --decode layer --writes staged,mapped \
    --top 6 2>&1 | tee "$OUT/kernels_writes.txt"
  timeout 150 python3 bench/bench_engine.py --mid --device gpu --tokens 24 --reps 3 --arenas 0.25 --decode layer \
    --writes staged,mapped 2>&1 | tee "$OUT/writes_mid.txt"
  timeout 120 python3 bench/bench_engine.py --device gpu --tokens 32 --reps 3 --arenas 0.25,1.0 --decode layer \
    --writes staged,mapped 2>&1 | tee "$OUT/writes_ref.txt"
fi
if [ "$what" = traced ]; then  # a full trace recorder at 25% (per-layer decode), beside the untraced run
  timeout 200 python3 -m pytest tests/test_engine_exact.py tests/test_hooks_trace.py -p no:cacheprovider \
    -o faulthandler_timeout=90 -k "handshake or trace" 2>&1 | tee "$OUT/traced_tests.txt" | tail -n 5
  timeout 200 python3 bench/bench_engine.py --device gpu --tokens 32 --reps 3 --arenas 0.25,1.0 --decode layer,auto \
    --trace-at 0.25,1.0 2>&1 | tee "$OUT/traced.txt"
fi
if [ "$what" = wide ]; then
  timeout ${BENCH_S:-300} python3 bench/bench_engine.py --wide --device gpu --tokens ${TOKENS:-32} --reps 3 --arenas 0.25 \
    --decode auto --writes staged --temp 0,1.0 --trace-at none 2>&1 | tee "$OUT/wide.txt" | tail -n 3
  for who in resident engine; do
    timeout 150 python3 bench/host_profile.py --wide --device gpu --who $who --writes staged --seconds 10 --rate 100 \
      ${NATIVE:+--native} --out "$OUT/spy" 2>&1 | tee "$OUT/spy_$who.txt" | head -n 40
  done
fi
if [ "$what" = nan ]; then
  timeout 150 python3 bench/nan_probe.py --device gpu --runs 4 --processes 3 --tokens 32 2>&1 | tee "$OUT/nan.txt"
fi
if [ "$what" = kernels ]; then
  timeout ${KERNELS_S:-150} python3 bench/gpu_kernels.py --tokens 32 2>&1 | tee "$OUT/kernels_ref.txt"
  timeout ${KERNELS_S:-150} python3 bench/gpu_kernels.py --mid --tokens 24 2>&1 | tee "$OUT/kernels_mid.txt"
fi
if [ "$what" = bench ]; then
  timeout ${BENCH_S:-200} python3 bench/bench_engine.py --device gpu --tokens 64 --reps 3 --arenas ${ARENAS:-1.0,0.5,0.25} \
    --decode auto,layer --profile ${PROFILE:-0} 2>&1 | tee "$OUT/bench_ref.txt"
  [ "${MID:-1}" = 1 ] && timeout ${BENCH_S:-200} python3 bench/bench_engine.py --mid --device gpu --tokens 48 --reps 3 --arenas 1.0,0.25 \
    --decode auto,layer --writes ${MID_WRITES:-staged,direct} --profile ${PROFILE:-0} 2>&1 | tee "$OUT/bench_mid.txt"
  [ -z "${QUICK:-}" ] && timeout 60 python3 bench/bench_readpath.py --device gpu --slot-writes-only --reps 3 2>&1 \
    | tee "$OUT/readpath.txt"
  timeout 150 python3 bench/bench_cold.py --device gpu --mode direct --tokens 24 --reps 2 --ahead none,layer:1 2>&1 \
    | tee "$OUT/cold.txt"
  timeout 60 python3 bench/bench_claims.py --device gpu --arenas 0.25 --writes staged,direct --reps 5 2>&1 \
    | tee "$OUT/claims.txt"
  timeout 60 python3 bench/bench_host.py --device gpu --arena 0.25 --tokens 32 2>&1 | tee "$OUT/host.txt"
  timeout 60 python3 bench/bench_sync.py --device gpu --tokens 64 --reps 5 2>&1 | tee "$OUT/sync.txt"
fi
