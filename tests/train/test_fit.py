"""Will it fit? ``laplax.train.fit``'s memory check and out-of-memory line (issue 32).

- The lower bound computed without compiling never exceeds what XLA then
  allocates (``memory_analysis()`` of the compiled train step), for a ViT
  and a GPT, with and without rematerialisation: the bound may refuse only
  what cannot fit.
- With the device's memory set just above the bound, the bound passes and
  the compiled figure refuses; set below it, the bound refuses; each is one
  line naming the estimate, the levers and ``--config.check_memory=False``;
  with ``check_memory=False`` nothing is checked.
- The host's available memory is ``/proc/meminfo``'s ``MemAvailable`` (what
  ``psutil`` reports too).
- ``RESOURCE_EXHAUSTED`` becomes one line; a full disk (tensorstore's
  ``RESOURCE_EXHAUSTED`` with an OS error) and other errors do not.
"""

import jax
import numpy as np
import pytest

from laplax import optim, sharding
from laplax import state as state_lib
from laplax.train import fit, loop

from helpers.tasks import gpt_task, vit_task


def _prepared(make, remat):
  """``(config, task, jitted step, abstract state, its shardings, batch shardings)``
  of a tiny task on one device."""
  config, build, _ = make()
  config.model.remat = remat
  config.model.scan_layers = False
  config.optim.grad_accum_steps = 2
  task = build()
  tx = optim.make_optimizer(config)
  schedule = optim.learning_rate_schedule(config.optim, 10)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  rules = sharding.rules_from_config(config)
  with sharding.context(mesh, rules):
    abstract, shardings = state_lib.abstract_and_shardings(task, tx, 0, mesh, rules)
    batch_sharding = loop.batch_shardings(task, mesh, rules)
    step = loop.jit_train_step(task, tx, schedule, shardings, batch_sharding)
  return config, task, step, abstract, shardings, batch_sharding, mesh, rules


def _compiled_peak(step, abstract, shardings, task, config, batch_sharding):
  state = jax.tree_util.tree_map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings
  )
  batch = {
    k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding[k])
    for k, v in task.batch_spec(config.batch_size).items()
  }
  mem = step.lower(state, batch).compile().memory_analysis()
  return (
    mem.argument_size_in_bytes
    + mem.output_size_in_bytes
    - mem.alias_size_in_bytes
    + mem.temp_size_in_bytes
  )


@pytest.mark.slow
@pytest.mark.parametrize("make,remat", [(vit_task, "none"), (gpt_task, "none")], ids=["vit", "gpt"])
def test_lower_bound_never_exceeds_the_compiled_step(make, remat):
  config, task, step, abstract, shardings, batch_sharding, mesh, rules = _prepared(make, remat)
  with sharding.context(mesh, rules):
    bound = fit.lower_bound(config, task, abstract, shardings, batch_sharding, "cpu")
    peak = _compiled_peak(step, abstract, shardings, task, config, batch_sharding)
  params = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(abstract.params))
  assert bound["state"] >= 3 * params  # AdamW: parameters and two moments
  assert bound["activations"] > 0
  assert bound["total"] == bound["state"] + bound["batch"] + bound["activations"]
  assert bound["total"] <= peak, (bound, peak)


def test_check_memory_refuses_by_the_bound_then_by_the_compiled_step(monkeypatch):
  config, task, step, abstract, shardings, batch_sharding, mesh, rules = _prepared(vit_task, "none")
  bound = fit.lower_bound(config, task, abstract, shardings, batch_sharding, "cpu")
  with sharding.context(mesh, rules):
    monkeypatch.setattr(
      fit, "available_bytes", lambda device=None: (bound["total"] - 1, "in the test")
    )
    with pytest.raises(fit.FitError) as e:
      fit.check_memory(config, task, step, abstract, shardings, batch_sharding)
    message = str(e.value)
    assert message.startswith("the train step needs at least ") and "\n" not in message
    for words in (
      "config.batch_size (now 8)",
      "config.optim.grad_accum_steps (now 2)",
      "config.model.remat=full",
      "config.mesh_shape",
      "--config.check_memory=False skips this check",
    ):
      assert words in message, message
    monkeypatch.setattr(
      fit, "available_bytes", lambda device=None: (bound["total"] + 1, "in the test")
    )
    with pytest.raises(fit.FitError, match=r"^the train step needs [\d.]+ GiB as compiled"):
      fit.check_memory(config, task, step, abstract, shardings, batch_sharding)
    config.check_memory = False  # skipped: nothing is compiled or refused
    fit.check_memory(config, task, None, abstract, shardings, batch_sharding)


def test_available_memory_is_memavailable():
  psutil = pytest.importorskip("psutil")
  have = fit._meminfo_available()
  if have is None:
    pytest.skip("no /proc/meminfo")
  assert 0 < have <= psutil.virtual_memory().total
  # Both read MemAvailable (a cgroup limit can only lower laplax's figure);
  # the two reads are moments apart, so allow what a busy machine moves.
  assert have <= psutil.virtual_memory().available + 2**30


class _Fake(Exception):
  pass


def test_out_of_memory_line_only_for_device_memory():
  oom = _Fake(
    "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while "
    "trying to allocate 68719476736 bytes.\nBufferAssignment OOM Debugging."
  )
  line = fit.out_of_memory(oom, vit_task()[0])
  assert line.startswith(
    "out of device memory (jaxlib.xla_extension.XlaRuntimeError: "
    "RESOURCE_EXHAUSTED: Out of memory while trying to allocate"
  )
  assert "\n" not in line and "config.batch_size (now 8)" in line
  assert "config.model.remat=full" in line
  assert "(now" not in fit.out_of_memory(oom)  # no config: the levers without values
  disk = (
    "RESOURCE_EXHAUSTED: Error writing local file: [os_error_code='28', "
    "os_error='No space left on device']"
  )
  assert fit.out_of_memory(_Fake(disk)) is None
  assert fit.out_of_memory(ValueError("shapes do not match")) is None
  assert np.isfinite(fit.GIB)


def test_train_cli_out_of_memory_names_the_run_config(
  tmp_path, fmnist_data_dir, capfd, monkeypatch
):
  """A step out of device memory under train.py: one line with this run's
  values (the config given to fit.out_of_memory explicitly), exit 2."""
  from test_train import run_in_process, train_args

  seen = []

  def exhausted(config, workdir, **kwargs):
    seen.append(config)
    raise _Fake("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1 bytes.")

  monkeypatch.setattr(loop, "train_and_evaluate", exhausted)
  r = run_in_process(train_args(tmp_path / "run", fmnist_data_dir, "--config.batch_size=24"), capfd)
  assert r.returncode == 2, r.stderr[-2000:]
  assert [l for l in r.stderr.splitlines() if l.startswith("error: ")] == [
    "error: out of device memory (RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
    "1 bytes.); " + fit.levers(seen[0])
  ]
  assert "config.batch_size (now 24)" in fit.levers(seen[0])
