#!/usr/bin/env bash
# The CPU-scale science check of docs/results.md, "Science check at CPU scale": the Fashion-MNIST ViT with
# 0 and with all 4 Laplacian heads and with spectral conditioning (0 Laplacian
# heads), and the Shakespeare GPT with 0 and all 4 Laplacian heads, each with
# the same budget; then eval.py --analysis on each and one comparison table
# per model family.
#   bash scripts/science_check.sh [RUNS_DIR]     # default runs/science
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-runs/science}
py=.venv/bin/python
vit_steps=${VIT_STEPS:-400}
gpt_steps=${GPT_STEPS:-1000}
vit() {  # name, config args, extra flags
  $py train.py --config "configs/vit_fashion_mnist.py:$2" --workdir "$runs/$1" \
    --config.total_steps="$vit_steps" --config.eval_every="$vit_steps" "${@:3}"
  $py eval.py --workdir "$runs/$1" --analysis
}
gpt() {
  $py train.py --config "configs/gpt_shakespeare.py:$2" --workdir "$runs/$1" \
    --config.total_steps="$gpt_steps" --config.eval_every="$gpt_steps"
  $py eval.py --workdir "$runs/$1" --analysis --analysis_examples 2000
}
vit vit_0L laplacian=0
vit vit_4L laplacian=4
vit vit_0L_spectral laplacian=0,spectral=True
gpt gpt_0L laplacian=0
gpt gpt_4L laplacian=4
$py -m laplax.analysis.compare "$runs/vit_0L" "$runs/vit_4L" "$runs/vit_0L_spectral" \
  --out "$runs/compare_vit.png"
$py -m laplax.analysis.compare "$runs/gpt_0L" "$runs/gpt_4L" --out "$runs/compare_gpt.png"
