"""Running train.py / eval.py as a user does: subprocesses or in-process, with tiny configs."""

import json
import logging
import os
import signal
import subprocess
import sys
import types

from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


CONFIG = os.path.join(ROOT, "configs", "vit_fashion_mnist.py")


# A tiny model so every step takes milliseconds on CPU.
TINY = [
  "--config.model.width=32",
  "--config.model.depth=1",
  "--config.model.num_heads=2",
  "--config.model.mlp_dim=32",
  "--config.model.patch_size=7",
  "--config.model.num_laplacian_heads=1",
  "--config.batch_size=32",
  "--config.eval_batch_size=2000",
  "--config.log_every=5",
  "--config.optim.warmup_steps=5",
]


def run(args, timeout=300, xla_defaults=False, **kwargs):
  """``python ARGS`` in the repository; ``xla_defaults``: without the suite's
  ``JAX_DISABLE_MOST_OPTIMIZATIONS`` and ``XLA_FLAGS`` (see conftest.py)."""
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  if xla_defaults:
    env.pop("JAX_DISABLE_MOST_OPTIMIZATIONS", None)
    env.pop("XLA_FLAGS", None)
  return subprocess.run(
    [sys.executable] + args,
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=timeout,
    env=env,
    **kwargs,
  )


def xla_env(num_devices=None, **extra):
  """``os.environ`` with ``extra``, and ``num_devices`` fake CPU devices added
  to the session's ``XLA_FLAGS`` (not replacing them)."""
  env = dict(os.environ, **extra)
  if num_devices is not None:
    env["XLA_FLAGS"] = (
      env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={num_devices}"
    ).strip()
  return env


def run_in_process(argv, capfd=None):
  """``python train.py ARGV[1:]`` or ``python eval.py ARGV[1:]`` in this
  process: its exit code and output (``capfd``: pytest's fixture; without it,
  as in a module-scoped fixture, the output is not returned). It saves
  the ~4 s a subprocess spends importing JAX, Flax, TFDS and orbax; the tests
  that need a process of its own (signals, exit paths, device counts, XLA's
  default flags) use :func:`run`, and test_bad_inputs.py runs some cases both
  ways. The two scripts' flags live in different ``FlagValues`` (train.py's in
  absl's global FLAGS, eval.py's in ``eval.FLAGS``)."""
  import importlib

  script = os.path.basename(argv[0])
  if script not in ("train.py", "eval.py"):
    raise ValueError(f"run_in_process runs train.py or eval.py, not {argv[0]}")
  module = importlib.import_module(script[:-3])
  fv = flags.FLAGS if script == "train.py" else module.FLAGS
  if capfd is not None:
    capfd.readouterr()
  saved_argv, saved_term = sys.argv, signal.getsignal(signal.SIGTERM)
  fv.unparse_flags()
  sys.argv = list(argv)
  # What a script's logging warnings print on stderr when no handler is set
  # (logging.lastResort), which pytest's log capture would otherwise take.
  handler = logging.StreamHandler(sys.stderr)
  handler.setLevel(logging.WARNING)
  logging.getLogger().addHandler(handler)
  code = 0
  try:
    module.run_cli()
  except SystemExit as e:
    code = e.code
  finally:
    logging.getLogger().removeHandler(handler)
    sys.argv = saved_argv
    signal.signal(signal.SIGTERM, saved_term)
    fv.unparse_flags()
    # config_flags defines a flag per config field at each parse.
    for flag in [f for f in flags.FLAGS if f.startswith("config.")]:
      delattr(flags.FLAGS, flag)
  out, err = capfd.readouterr() if capfd is not None else ("", "")
  return types.SimpleNamespace(returncode=code, stdout=out, stderr=err)


def train_args(workdir, data_dir, *extra, config=CONFIG):
  return (
    [
      "train.py",
      "--config",
      config,
      "--workdir",
      str(workdir),
      f"--config.data.data_dir={data_dir}",
    ]
    + TINY
    + list(extra)
  )


def read_metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]
