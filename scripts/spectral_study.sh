#!/usr/bin/env bash
# The spectral-conditioning study of docs/results.md, "Spectral conditioning: layouts and
# saturation" on the default ViT (Fashion-MNIST, width 128, 4 heads of 32) with
# 0 Laplacian heads, so that only the spectral correction differs:
#   init:  a step-0 checkpoint (--config.total_steps=0) of each variant and
#          eval.py --analysis on it (entropy, self-weight, head similarity,
#          conditioning, Jacobians), the same variants after 20 steps for the
#          W_Q/W_K gradient norms; then one table.
#   train: 1200 steps (the config's budget) of baseline, full, per_head,
#          fused (lambda 10) and full at the small lambda the init table
#          picks, then eval.py; RUNS (names baseline, MODE or MODE_lamX)
#          chooses which.
#   bash scripts/spectral_study.sh init  [RUNS_DIR]    # default runs/spectral
#   RUNS="baseline full per_head fused full_lam2" bash scripts/spectral_study.sh train
#   bash scripts/spectral_study.sh table [RUNS_DIR]    # print both tables
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:?init, train or table}
runs=${2:-runs/spectral}
py=.venv/bin/python
run() {  # name, steps, extra flags
  $py train.py --config configs/vit_fashion_mnist.py:laplacian=0 --workdir "$runs/$1" \
    --config.total_steps="$2" "${@:3}"
}
short() {  # name, steps, extra flags: init runs evaluate 1000 test images only
  run "$@" --config.data.eval_split="test[:1000]"
}
sp() {  # mode, lam: the spectral flags
  echo --config.model.spectral.enabled=True --config.model.spectral.mode="$1" \
    --config.model.spectral.lam="$2"
}
case $what in
  init)
    short init_baseline 0
    for mode in full per_head fused; do short "init_$mode" 0 $(sp "$mode" 10); done
    for lam in 1 2 5; do short "init_full_lam$lam" 0 $(sp full "$lam"); done
    short init_full_qk_norm 0 $(sp full 10) --config.model.qk_norm=True
    for d in "$runs"/init_*; do
      $py eval.py --workdir "$d" --analysis --analysis_examples 512; done
    # At step 0 the zero-initialised classifier passes no gradient to the
    # backbone: the W_Q / W_K gradient norms are measured after 20 steps.
    for d in "$runs"/init_*; do
      name=${d##*/init_}
      flags=$(python3 -c "import json,sys; m=json.load(open('$d/config.json'))['model']; s=m['spectral']; print('--config.model.spectral.enabled=%s --config.model.spectral.mode=%s --config.model.spectral.lam=%s --config.model.qk_norm=%s' % (s['enabled'], s['mode'], s['lam'], m['qk_norm']))")
      short "grad20_$name" 20 $flags
      $py eval.py --workdir "$runs/grad20_$name" --analysis --analysis_examples 256 \
        --analysis_jacobian_dim 0
    done
    ;;
  train)
    for name in ${RUNS:-baseline full per_head fused full_lam2}; do
      if [ "$name" = baseline ]; then run baseline 1200
      else
        mode=${name%%_lam*}; lam=10
        [ "$mode" != "$name" ] && lam=${name##*_lam}
        run "$name" 1200 $(sp "$mode" "$lam")
      fi
      $py eval.py --workdir "$runs/$name"
    done
    ;;
  table) ;;
  *) echo "usage: $0 init|train|table [RUNS_DIR]" >&2; exit 2 ;;
esac
$py scripts/spectral_table.py "$runs"
