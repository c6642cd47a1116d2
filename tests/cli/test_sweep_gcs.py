"""``python -m laplax.sweep --workdir gs://BUCKET/PATH`` against a real GCS emulator.

A 2-run sweep with ``--analysis`` (tests/cli/test_sweep.py's tiny ViT, in
this process) writes its runs' workdirs, logs, analyses, ``sweep.json``, the
summaries and ``curves.png`` as objects; the same command then skips both runs and leaves every run's objects
as they were. No local folder ``gs:`` is made.
"""

import importlib.util
import json
import os

import pytest

if not all(importlib.util.find_spec(m) for m in ("gcsfs", "gcp_storage_emulator")):
  pytest.skip(
    "needs gcsfs and gcp-storage-emulator (requirements-test.txt)", allow_module_level=True
  )

from laplax import (
  store,  # noqa: E402
  sweep,  # noqa: E402
)
from laplax.analysis import seeds  # noqa: E402

from helpers.gcs import gcs_fixture, objects  # noqa: E402, F401  (the fixture gcs)
from helpers.runs import CONFIG, ROOT, TINY, run_in_process  # noqa: E402

# tests/cli/test_sweep.py's runs: 4 steps of the tiny ViT, a checkpoint every 2.
SWEEP_TINY = [
  a for a in TINY if not a.startswith(("--config.model.num_laplacian_heads", "--config.log_every"))
] + [
  "--config.total_steps=4",
  "--config.log_every=1",
  "--config.checkpoint_every=2",
  "--config.eval_every=1000",
  "--config.eval_batch_size=250",
  "--config.data.eval_split=test[:500]",
]


class InProcessGcsSweep:
  """``python -m laplax.sweep ARGV`` in this process with its runs
  (:func:`helpers.runs.run_in_process` in place of ``sweep._call_logged``,
  so ``sweep._call`` still stages the ``gs://`` logs); ``__call__`` returns
  ``(exit code, stdout, stderr)``."""

  def __init__(self, capfd, monkeypatch):
    self.capfd, self.stdout = capfd, []
    monkeypatch.setattr(sweep, "_call_logged", self.call)
    monkeypatch.setattr(sweep._Child, "planning", True)  # what main() changes

  def call(self, script, args, log_path):
    assert not store.is_remote(log_path)  # the local file sweep._call uploads
    self.stdout.append(self.capfd.readouterr().out)
    r = run_in_process([script, *args], self.capfd)
    with open(log_path, "a") as log:
      log.write(f"\n$ {script} {' '.join(args)}\n" + r.stdout + r.stderr)
    return r.returncode or 0

  def __call__(self, argv):
    import signal

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    self.capfd.readouterr()
    try:
      code = sweep.main(argv)
    finally:
      for s, handler in handlers.items():
        signal.signal(s, handler)
    out, err = self.capfd.readouterr()
    self.stdout.append(out)
    return code, "".join(self.stdout), err


@pytest.mark.slow
def test_two_run_sweep_on_gs_then_the_same_command_skips(gcs, fmnist_data_dir, capfd, monkeypatch):
  url = f"gs://{gcs.bucket}/sweep"
  argv = ["--config", CONFIG, "--workdir", url, "--seeds", "0"]
  argv += ["--grid", "model.num_laplacian_heads=0,1", f"--config.data.data_dir={fmnist_data_dir}"]
  plain = argv + SWEEP_TINY
  argv = plain + ["--analysis", "--analysis_examples=32"]
  code, stdout, stderr = InProcessGcsSweep(capfd, monkeypatch)(argv)
  assert code == 0, stdout[-2000:] + stderr[-2000:]
  names = [r.name for r in sweep.plan(CONFIG, sweep.parse_grid(argv[7:8]), [0], [], url)]
  assert names == ["num_laplacian_heads=0,seed=0", "num_laplacian_heads=1,seed=0"]
  found = set(objects(gcs.url, gcs.bucket, "sweep/"))
  for name in ("sweep.json", "summary.json", "summary.md", "curves.png"):
    assert f"sweep/{name}" in found, name
  for n in names:
    names_of_run = ("config.json", "eval.json", "analysis.json", "analysis_", "train.log")
    for name in names_of_run + ("eval.log", "checkpoints/4/state"):
      assert any(o.startswith(f"sweep/{n}/{name}") for o in found), (n, name)
    assert any(o.startswith(f"sweep/{n}/analysis_") and o.endswith(".png") for o in found)
    assert store.read_text(f"{url}/{n}/train.log").count("$ train.py") == 1
    assert store.read_text(f"{url}/{n}/eval.log").count("$ eval.py") == 2  # eval, analysis
    steps = [r["step"] for r in seeds.read_metrics(f"{url}/{n}") if r["split"] == "train"]
    assert steps == [1, 2, 3, 4]
  summary = json.loads(store.read_text(f"{url}/summary.json"))
  assert summary["unfinished"] == [] and set(summary["runs"]) == set(names)
  for n in names:  # the summary holds what each run's eval.json says
    evaluated = json.loads(store.read_text(f"{url}/{n}/eval.json"))
    assert summary["runs"][n]["metrics"]["accuracy"] == evaluated["accuracy"]
    assert summary["runs"][n]["layers"], n  # analysis.json's per-layer quantities
  # The same command: both runs finished before, their objects untouched.
  before = {o: store.generation(f"gs://{gcs.bucket}/{o}") for o in found if "=" in o}
  code, stdout, stderr = InProcessGcsSweep(capfd, monkeypatch)(argv)
  assert code == 0, stderr[-2000:]
  assert [l for l in stdout.splitlines() if "finished before, skipped" in l] == [
    f"[{i}/2] {n}: finished before, skipped" for i, n in enumerate(names, 1)
  ]
  after = {o: store.generation(f"gs://{gcs.bucket}/{o}") for o in before}
  assert after == before
  # Another command on the same gs:// sweep is refused in one line, nothing written.
  code, _, stderr = InProcessGcsSweep(capfd, monkeypatch)(plain)
  assert code == 2 and "holds a sweep with analysis=True" in stderr, stderr[-2000:]
  assert not os.path.exists(os.path.join(ROOT, "gs:")) and not os.path.exists("gs:")
