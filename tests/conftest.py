"""Shared pytest set-up: how XLA compiles for the tests, and Fashion-MNIST prepared once.

Compiling, not running, is most of the suite's time: its models are tiny.
:func:`pytest_configure` sets, before JAX is imported and for the whole
session (xdist workers and every subprocess inherit the environment):

- ``JAX_COMPILATION_CACHE_DIR``: one new temporary directory as JAX's
  persistent compilation cache. Many tests run ``train.py``/``eval.py`` in
  subprocesses on the same tiny models (kill-and-resume chains, the CLIs), so
  a program is compiled once per session; a cache hit loads the executable
  XLA compiled for the same program, so results are bitwise those of a compile.
- ``JAX_DISABLE_MOST_OPTIMIZATIONS=1``: XLA's backend optimisation off, which
  compiles about 30% faster and runs slower; the tests check values and
  equalities, and everything one test compares runs under the same setting.
  ``test_train.test_train_then_eval_reports_same_accuracy`` runs train.py
  and eval.py with XLA's defaults (what users, ``bench/`` and the documentation's
  numbers get).
- ``XLA_FLAGS`` += :data:`FAST_COMPILE_FLAGS`: XLA's CPU backend without its
  MLIR fusion emitters (the older LLVM emitters), which compile a small
  program in about 29 instead of 50 ms. The
  suite compiles thousands of them (every new shape of an op run outside
  ``jit`` is one): ``tests/models/test_gpt.py`` alone 70 -> 55 s. Subprocesses that
  set their own device count append to these (``test_train.xla_env``).

A value the user has set for any of these is left as it is.

:func:`pytest_runtest_teardown` keeps SIGINT as a terminal gives it to a
command: a test that leaves it ignored in the test process (ignored
dispositions pass to every child, and a shell cannot trap a signal ignored at
its start, nor Python turn it into KeyboardInterrupt) gets it restored and a
warning naming it, so that the Ctrl-C tests after it see what a user's
terminal gives.

:func:`pytest_collection_modifyitems` puts the longest test files first
(:data:`LONGEST_FIRST`), so that with ``-n 2 --dist loadfile`` the other
worker runs the many short files meanwhile instead of waiting at the end.
"""

import os
import shutil
import signal
import tempfile
import threading
import warnings

import pytest

from helpers.lm import SENTENCE

FMNIST_SOURCE = "/usr/share/datasets/fashion-mnist"
_CACHE_OWNER = "LAPLAX_TEST_CACHE_OWNER"
FAST_COMPILE_FLAGS = "--xla_cpu_use_fusion_emitters=false"
# The test files that take longest (about 3.5, 2.5, 1.5, 1 and 2 minutes of one
# worker on a 2-core machine), in that order; the rest keep their order. Two
# heavy files side by side run slower than a heavy and a light one (the runs
# of 2026-12-01: with test_convert_timm.py and test_memory.py also first the
# suite took 14.9 instead of 12.5 minutes), so only these go first.
LONGEST_FIRST = (
  "test_resume.py",
  "test_sweep.py",
  "test_notebook.py",
  "test_dino.py",
  "test_configs.py",
  "test_sharding.py",
)


def pytest_configure(config):
  """Sets the session's compilation cache (the xdist controller's, shared)."""
  os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
  os.environ.setdefault("XLA_FLAGS", FAST_COMPILE_FLAGS)
  if "JAX_COMPILATION_CACHE_DIR" in os.environ:
    return
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="laplax_jax_cache_")
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
  os.environ[_CACHE_OWNER] = str(os.getpid())


def pytest_unconfigure(config):
  """Removes the cache directory in the process that made it."""
  if os.environ.get(_CACHE_OWNER) == str(os.getpid()):
    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


def pytest_collection_modifyitems(items):
  """Orders the tests file by file, :data:`LONGEST_FIRST` files first."""
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session")
def fmnist_data_dir(tmp_path_factory):
  """A TFDS data_dir holding ``fashion_mnist_idx`` prepared from the real IDX files."""
  if not os.path.exists(os.path.join(FMNIST_SOURCE, "train-images-idx3-ubyte.gz")):
    pytest.skip("Fashion-MNIST missing: apt-get install -y dataset-fashion-mnist")
  from laplax.data.vision import images

  data_dir = str(tmp_path_factory.mktemp("tfds"))
  config = images.default_config()
  config.data_dir = data_dir
  config.source_dir = FMNIST_SOURCE
  images.prepare(config)
  return data_dir


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """Three documents of one repeated sentence (the last one is validation)."""
  d = tmp_path_factory.mktemp("corpus")
  for name in ("a", "b", "c"):
    (d / f"{name}.txt").write_text(SENTENCE * 150)
  return d


def _sigint_ignored() -> bool:
  """Whether SIGINT is ignored (``SIG_IGN``) in this process, from ``/proc``
  (also where native code set it, which :func:`signal.getsignal` misses)."""
  try:
    with open("/proc/self/status") as f:
      ignored = next(line for line in f if line.startswith("SigIgn:"))
  except (OSError, StopIteration):
    return False
  return bool(int(ignored.split()[1], 16) >> (signal.SIGINT - 1) & 1)


def pytest_runtest_teardown(item, nextitem):
  """Restores SIGINT's default (KeyboardInterrupt) after a test that left it ignored."""
  if threading.current_thread() is threading.main_thread() and _sigint_ignored():
    signal.signal(signal.SIGINT, signal.default_int_handler)
    warnings.warn(
      f"{item.nodeid} left SIGINT ignored; restored for the tests after it", stacklevel=1
    )
