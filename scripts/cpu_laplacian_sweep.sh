#!/usr/bin/env bash
# The authors' nanochat-fork sweep (runs/laplacian_sweep.sh: depth x Laplacian
# heads x seeds, val_bpb and CORE per cell) at CPU scale (docs/language-models.md,
# "The fork's sweep at CPU scale"): the fork's recipe
# (configs/gpt_d20.py:recipe=nanochat-fork) at depth 1 and 2 (width 128, one
# head of 128) with 0 or 1 Laplacian heads, seeds 1 and 2, on the Shakespeare
# works written as parquet shards, nanochat's tokenizer trained on them (2,048
# tokens), context 64, 16 sequences a step, STEPS updates; CORE on a SMALL
# BUNDLE MADE FROM THE HELD-OUT WORKS in DCLM's layout (not DCLM's tasks; the
# real bundle cannot be downloaded here), all its examples.
#   bash scripts/cpu_laplacian_sweep.sh [RUNS_DIR]      # default runs/fork_cpu_sweep
# FLOPS_BUDGETS="1e12,4e12" sweeps fixed FLOPs budgets instead of STEPS updates,
# as the fork's FLOPS_BUDGETS: each run trains round(F / (FLOPs/token x 16 x 64))
# updates (config.target_flops), and results.csv's flops_budget says which.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-runs/fork_cpu_sweep}
py=.venv/bin/python
steps=${STEPS:-100}
# (the arguments of a run without budgets are those of earlier versions, so an
# existing sweep directory resumes)
if [ -n "${FLOPS_BUDGETS:-}" ]; then  # the budget's updates; eval and save at the last
  budgets=(--grid ":target_flops=$FLOPS_BUDGETS")
  horizon=()
  every=1000000
else
  budgets=()
  horizon=(--config.total_steps="$steps")
  every=$steps
fi
stamp() { echo "[$(date -u +%H:%M:%S)] $*"; }
stamp "shards and CORE bundle"
$py -m laplax.data.text.shakespeare_shards "$runs/data"
stamp "sweep"
$py -m laplax.sweep --config configs/gpt_d20.py:recipe=nanochat-fork "${budgets[@]}" \
  --grid :depth=${DEPTHS:-1,2} --grid :laplacian=${LAPLACIAN_HEADS:-0,1} --seeds ${SEEDS:-1,2} \
  --workdir "$runs/sweep" \
  --config.data.source_dir="$runs/data/shards" --config.data.vocab_size=2048 \
  --config.data.streams=1 --config.data.max_eval_tokens=16384 \
  --config.model.max_length=64 --config.model.dtype=float32 \
  --config.model.embedding_dtype=float32 \
  --config.batch_size=16 --config.eval_batch_size=16 "${horizon[@]}" \
  --config.eval_every="$every" --config.checkpoint_every="$every" --config.log_every=25 \
  --config.eval.sample_tokens=0 --config.evals=bits_per_byte,core \
  --config.eval.core_bundle="$runs/data/core_bundle" --config.eval.core_max_per_task=0
stamp "done: $runs/sweep/summary.md, $runs/sweep/results.csv"
