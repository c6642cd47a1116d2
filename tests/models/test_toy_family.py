"""A model family added in a scratch module, touching no file of the repository.

The module (:data:`TOY_MODULE`, written to ``tmp_path``) holds what
``docs/architecture.md`` ("Adding a model family") says a family needs: a
spec class, a Flax model that takes it whole, and a
:class:`~laplax.models.registry.Family` it registers. The config, the
classification task, the validation and ``train.py`` then take
``model.name="toy"`` as they take a ViT.
"""

import json
import os
import sys
import textwrap

import jax
import numpy as np
import pytest

from laplax.config import defaults
from laplax.config import validation as config_lib
from laplax.models import registry
from laplax.models import spec as spec_lib

from helpers.runs import read_metrics, run_in_process

#: The scratch family: patches, one linear map, the shared blocks, mean pooling, a head.
TOY_MODULE = '''
import dataclasses

import flax.linen as nn

from laplax.models import layers
from laplax.models.registry import Family, register
from laplax.models.spec import TransformerSpec, spec_field


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToySpec(TransformerSpec):
  """A toy vision transformer: square patches, mean pooling."""

  patch_size: int = spec_field(4, "int", min=1)


class Toy(nn.Module):
  """Patches -> Dense -> blocks -> mean -> head."""

  spec: ToySpec
  num_classes: int = 0

  @nn.compact
  def __call__(self, images, *, train=False):
    p = self.spec.patch_size
    b, h, w, c = images.shape
    x = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
    x = nn.Dense(self.spec.width, name="embedding")(x.reshape(b, (h // p) * (w // p), -1))
    x, out = layers.transformer_blocks(x, self.spec, call={"deterministic": not train})
    x = layers.norm_layer(self.spec, "encoder_norm")(x).mean(axis=1)
    x = layers.classifier_head(x, self.num_classes, True)
    return x, out


def attention_lengths(config, image_side=None, crop_sides=()):
  side = config.data.get("image_size", None) or image_side
  return ((int(side) // config.model.patch_size) ** 2,) if side else ()


FAMILY = register(
  Family(
    name="toy",
    spec=ToySpec,
    model=Toy,
    task="classification",
    attention_lengths=attention_lengths,
    image_patches=True,
  )
)
'''

#: A config file that imports the family (so ``train.py`` knows it) and names it.
TOY_CONFIG = """
import toy_family  # registers model.name="toy"

from laplax.config import defaults


def get_config():
  c = defaults.base_config()
  c.model = defaults.model_config("toy")
  c.model.update(width=16, depth=2, num_heads=2, mlp_dim=32, patch_size=7, num_laplacian_heads=1)
  c.batch_size = 32
  c.eval_batch_size = 2000
  c.total_steps = 4
  c.log_every = 2
  c.eval_every = 4
  c.checkpoint_every = 4
  c.optim.warmup_steps = 2
  return c
"""


@pytest.fixture
def toy(tmp_path, monkeypatch):
  """The scratch module on ``sys.path``, imported; the registry restored after."""
  monkeypatch.setattr(registry, "_FAMILIES", dict(registry.families()))
  (tmp_path / "toy_family.py").write_text(textwrap.dedent(TOY_MODULE))
  (tmp_path / "toy_config.py").write_text(textwrap.dedent(TOY_CONFIG))
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "toy_family", raising=False)
  import toy_family

  yield toy_family
  sys.modules.pop("toy_family", None)


def test_a_registered_family_is_a_config_family(toy):
  """Its fields are its config keys, the classification task trains it, the
  validation checks its values and its image size, its hook gives the lengths."""
  assert registry.get("toy") is toy.FAMILY and "toy" in spec_lib.FAMILIES
  from laplax.tasks.classification import ClassificationTask

  assert "toy" in ClassificationTask.families
  model = defaults.model_config("toy")
  assert model.name == "toy" and model.patch_size == 4 and model.num_laplacian_heads == 0
  spec = spec_lib.build("toy", width=16, depth=2, num_heads=2, num_laplacian_heads=1)
  assert isinstance(spec, toy.ToySpec)
  assert spec.laplacian == ((False, True), (False, True))
  with pytest.raises(spec_lib.SpecError, match=r"model.patch_size=0 must be an integer >= 1"):
    spec_lib.build("toy", patch_size=0)
  config = defaults.base_config()
  config.model = model
  config.data.image_size = 28
  config.model.patch_size = 7
  assert config_lib.attention_lengths(config) == (16,)
  config.model.patch_size = 5  # 28 is not a multiple of 5: the image_patches check
  with pytest.raises(config_lib.ConfigError, match="not divisible by config.model.patch_size=5"):
    config_lib.check_model(config, "cpu")
  # The model: patches of 28 // 7 = 4 per side, 16 tokens, 10 classes.
  net = toy.Toy(spec_lib.build("toy", width=16, depth=2, num_heads=2, patch_size=7), num_classes=10)
  images = jax.ShapeDtypeStruct((2, 28, 28, 1), np.float32)
  params = jax.eval_shape(net.init, jax.random.PRNGKey(0), images)  # traced, not compiled
  assert params["params"]["embedding"]["kernel"].shape == (7 * 7, 16)
  logits, out = jax.eval_shape(net.apply, params, images)
  assert logits.shape == (2, 10) and set(out) == {"block0", "block1"}


def test_an_unknown_family_is_refused_in_one_line():
  """Without its module the name is unknown, with the families that exist."""
  with pytest.raises(spec_lib.SpecError) as e:
    spec_lib.build("toy")
  message = str(e.value)
  assert message.startswith("model.name='toy' is unknown; use one of ")
  assert "\n" not in message and "vit" in message and "gpt" in message


@pytest.mark.slow
def test_train_py_trains_a_scratch_family(toy, tmp_path, fmnist_data_dir, capfd):
  """``train.py --config toy_config.py`` trains it: finite losses, an
  evaluation, a checkpoint of the toy's own parameters, ``model.name`` saved."""
  workdir = tmp_path / "run"
  argv = [
    "train.py",
    f"--config={tmp_path / 'toy_config.py'}",
    f"--workdir={workdir}",
    f"--config.data.data_dir={fmnist_data_dir}",
  ]
  r = run_in_process(argv, capfd)
  assert r.returncode == 0, r.stderr[-3000:]
  records = read_metrics(workdir)
  train = [r for r in records if r["split"] == "train"]
  assert [r["step"] for r in train] == [2, 4] and all(np.isfinite(r["loss"]) for r in train)
  final = [r for r in records if r["split"] == "eval"][-1]
  assert final["step"] == 4 and final["num_examples"] == 10000
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["model"]["name"] == "toy" and saved["model"]["width"] == 16
  assert os.path.isdir(workdir / "checkpoints" / "4")
