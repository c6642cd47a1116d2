"""``config.init_from``: a new run starts from another workdir's parameters."""

import jax
import numpy as np
import pytest

from laplax import optim, tasks
from laplax import state as state_lib
from laplax.config import validation as config_lib
from laplax.convert import common
from laplax.train import finetune, loop

from helpers.configs import load


def tiny_config(**model):
  c = load("vit_fashion_mnist")
  c.model.update(
    dict(width=16, depth=1, num_heads=2, mlp_dim=32, patch_size=7, num_laplacian_heads=0), **model
  )
  return c


def abstract_params(config, num_classes=10):
  task = tasks.ClassificationTask(config, num_classes, (28, 28, 1))
  return state_lib.abstract_state(task, optim.make_optimizer(config), 0).params


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """A workdir (written as laplax.convert writes one) and its parameters."""
  config = tiny_config()
  task = tasks.ClassificationTask(config, 10, (28, 28, 1))
  params = jax.device_get(task.init(jax.random.PRNGKey(3)))
  params["head"]["kernel"] = np.full_like(params["head"]["kernel"], 0.5)
  workdir = str(tmp_path_factory.mktemp("init") / "run")
  common.write_workdir(workdir, config, params, num_classes=10, image_shape=(28, 28, 1))
  return workdir, params


def test_same_model_gets_every_parameter_and_laplacian_heads_may_differ(source):
  workdir, params = source
  got = finetune.initial_params(workdir, abstract_params(tiny_config(num_laplacian_heads=1)))
  for name, value in common.flat(params).items():
    np.testing.assert_array_equal(common.flat(got)[name], value, err_msg=name)


def test_head_of_another_number_of_classes_is_left_to_the_new_run(source):
  workdir, params = source
  got = finetune.initial_params(workdir, abstract_params(tiny_config(), 5))
  assert got["head"]["kernel"] is None and got["head"]["bias"] is None
  np.testing.assert_array_equal(got["embedding"]["kernel"], params["embedding"]["kernel"])


@pytest.mark.parametrize(
  "model,num_classes,fragment",
  [
    ({"width": 32, "num_heads": 2}, 10, "bias has shape (16,), this model's is (32,)"),
    ({}, 0, "has parameter head/bias that this model has not"),
    ({"layerscale_init": 1e-6}, 10, "lacks parameter block0/ls1/scale"),
  ],
)
def test_mismatch_is_one_line_naming_the_parameter(source, model, num_classes, fragment):
  workdir, _ = source
  with pytest.raises(config_lib.ConfigError) as e:
    finetune.initial_params(workdir, abstract_params(tiny_config(**model), num_classes))
  assert fragment in str(e.value) and "\n" not in str(e.value)


def test_written_workdir_has_the_usual_permissions(source):
  import os

  umask = os.umask(0)
  os.umask(umask)
  assert os.stat(source[0]).st_mode & 0o777 == 0o777 & ~umask


def test_a_learned_mix_the_saved_run_lacks_starts_at_its_initialisation(source):
  workdir, params = source
  got = finetune.initial_params(
    workdir, abstract_params(tiny_config(num_laplacian_heads=1, laplacian_mix="learned"))
  )
  assert got["block0"]["attention"]["laplacian_mix"] is None
  np.testing.assert_array_equal(got["head"]["kernel"], params["head"]["kernel"])


@pytest.mark.slow
def test_failed_init_from_leaves_no_workdir(source, tmp_path, fmnist_data_dir):
  config = tiny_config(mlp_dim=64)
  config.data.data_dir = fmnist_data_dir
  config.init_from = source[0]
  workdir = tmp_path / "new"
  with pytest.raises(finetune.InitFromError, match="mlp/fc1/bias has shape"):
    loop.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()


def test_keys_the_config_argument_changes_count_as_given():
  from laplax.cli import common as cli

  from helpers.runs import CONFIG

  assert "num_laplacian_heads" in cli.explicit_model_keys(
    ["x", "--config", CONFIG + ":laplacian=1"]
  )
  assert cli.explicit_model_keys(
    ["x", f"--config={CONFIG}:spectral=False", "--config.model.width=8"]
  ) == ["width"]
