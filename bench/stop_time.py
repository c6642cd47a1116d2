"""How fast laplax commands stop, and how fast runs that cannot fit are refused.

    python bench/stop_time.py --data_dir ~/tensorflow_datasets --out runs/stop_time

Runs the real commands in subprocesses (in fresh directories under ``--out``)
and prints, for each case, the exit code, the seconds from the (last) signal
or from the start to the exit, the last line of stderr, and whether
``train.lock`` is gone:

- ``stalled, one SIGTERM`` / ``stalled, two SIGINTs``: the tiny ViT of the
  tests with ``--config.debug.stall_at_step=3`` (its step 3 never ends),
  signalled once step 2 is saved;
- ``compiling, one SIGTERM``: the default ViT on a new workdir, signalled 3 s
  after ``train.lock`` appeared (the data is prepared, the train step
  compiling: the main thread is inside XLA);
- ``eval.py, one SIGINT`` (with ``--eval_workdir``): ``eval.py --out`` of
  that workdir, signalled once it has a checkpoint file open (restoring);
- the three refusals of issue 32 (``batch_size=100000000`` on the default
  ViT, ``width=16384, depth=48`` on it, ``batch_size=4096, width=4096`` on the
  default GPT): seconds from start to exit, and whether the new workdir
  exists.
"""

import argparse
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VIT, GPT = "configs/vit_fashion_mnist.py", "configs/gpt_shakespeare.py"
TINY = [
  "--config.model.width=32",
  "--config.model.depth=1",
  "--config.model.num_heads=2",
  "--config.model.mlp_dim=32",
  "--config.model.patch_size=7",
  "--config.model.num_laplacian_heads=1",
  "--config.batch_size=32",
  "--config.eval_batch_size=200",
  "--config.total_steps=8",
  "--config.checkpoint_every=2",
  "--config.log_every=1",
  "--config.eval_every=1000",
  "--config.data.eval_split=test[:200]",
  "--config.debug.stall_at_step=3",
]


def _start(args, log):
  return subprocess.Popen(
    [sys.executable] + args,
    cwd=ROOT,
    stdout=log,
    stderr=log,
    env=dict(os.environ, PYTHONUNBUFFERED="1"),
  )


def _wait_for(proc, ready, timeout=900):
  deadline = time.time() + timeout
  while proc.poll() is None and time.time() < deadline and not ready():
    time.sleep(0.01)


def _report(name, proc, t0, log_path, workdir):
  code = proc.wait()
  seconds = time.time() - t0
  with open(log_path) as f:
    lines = [l for l in f.read().replace("\r", "\n").splitlines() if l.strip()]
  lock = "lock gone" if not os.path.exists(os.path.join(workdir, "train.lock")) else "LOCK LEFT"
  print(
    f"{name}: exit {code} after {seconds:.1f} s, {lock}: {lines[-1] if lines else ''}", flush=True
  )


def _reads_checkpoints(pid: int) -> bool:
  """Whether process ``pid`` has a file under a ``checkpoints/`` open (Linux)."""
  try:
    fds = os.listdir(f"/proc/{pid}/fd")
  except OSError:
    return False
  for fd in fds:
    try:
      if "/checkpoints/" in os.readlink(f"/proc/{pid}/fd/{fd}"):
        return True
    except OSError:
      pass
  return False


def stop(name, args, workdir, ready, signals, out):
  """Starts ``args``, waits for ``ready(proc)``, sends ``signals`` (the second
  once the first is acknowledged) and reports."""
  log_path = os.path.join(out, name.replace(" ", "_").replace(",", "") + ".log")
  with open(log_path, "w") as log:
    proc = _start(args, log)
  _wait_for(proc, lambda: ready(proc))
  for i, signum in enumerate(signals):
    if i:
      _wait_for(proc, lambda: "stopping after" in open(log_path).read())
    t0 = time.time()
    proc.send_signal(signum)
  _report(name, proc, t0, log_path, workdir)


def refuse(name, args, workdir, out):
  log_path = os.path.join(out, name.replace(" ", "_").replace(",", "") + ".log")
  t0 = time.time()
  with open(log_path, "w") as log:
    proc = _start(args + ["--workdir", workdir], log)
  proc.wait()
  _report(name + f" (workdir created: {os.path.exists(workdir)})", proc, t0, log_path, workdir)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--data_dir", default=os.path.expanduser("~/tensorflow_datasets"))
  parser.add_argument("--out", required=True, help="a new directory for the runs")
  parser.add_argument("--eval_workdir", help="also stop eval.py on this trained workdir")
  args = parser.parse_args()
  os.makedirs(args.out)
  data = [f"--config.data.data_dir={args.data_dir}"]
  cases = (
    ("stalled, one SIGTERM", [signal.SIGTERM]),
    ("stalled, two SIGINTs", [signal.SIGINT, signal.SIGINT]),
  )
  for name, signals in cases:
    workdir = os.path.join(args.out, name.split(", ")[1].replace(" ", "_"))
    saved = os.path.join(workdir, "checkpoints", "2")
    stop(
      name,
      ["train.py", "--config", VIT, "--workdir", workdir] + data + TINY,
      workdir,
      lambda _, saved=saved: os.path.isdir(saved),
      signals,
      args.out,
    )
  workdir = os.path.join(args.out, "compiling")
  lock = os.path.join(workdir, "train.lock")
  stop(
    "compiling, one SIGTERM",
    ["train.py", "--config", VIT, "--workdir", workdir] + data,
    workdir,
    lambda _: os.path.exists(lock) and time.time() > os.path.getmtime(lock) + 3,
    [signal.SIGTERM],
    args.out,
  )
  if args.eval_workdir:  # a run whose evaluation takes a while (e.g. the default ViT's)
    stop(
      "eval.py, one SIGINT",
      [
        "eval.py",
        "--workdir",
        args.eval_workdir,
        "--out",
        os.path.join(args.out, "eval", "eval.json"),
      ],
      args.out,
      lambda proc: _reads_checkpoints(proc.pid),
      [signal.SIGINT],
      args.out,
    )
  for name, extra in (
    ("ViT batch_size=100000000", [VIT, "--config.batch_size=100000000"]),
    ("ViT width=16384 depth=48", [VIT, "--config.model.width=16384", "--config.model.depth=48"]),
    (
      "GPT batch_size=4096 width=4096",
      [GPT, "--config.batch_size=4096", "--config.model.width=4096"],
    ),
  ):
    refuse(
      name,
      ["train.py", "--config"] + extra + data,
      os.path.join(args.out, name.split()[0] + "_" + name.split()[1]),
      args.out,
    )


if __name__ == "__main__":
  main()
