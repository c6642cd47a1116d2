"""LRA ListOps (laplax/data/lra/listops.py), the encoder and its task.

* The generator's expressions evaluate, by a tree walk transcribed from the
  release's ``to_value`` (``lra_benchmarks/data/listops.py``), to the target
  written; lengths respect the limits; the files round-trip through the
  release-format reader; a malformed file is one line (exit 2 for the CLI).
* ``configs/nystrom_listops.py`` (CPU size) trains a few steps on generated
  data with Nystrom and with softmax attention, Laplacian heads and spectral
  conditioning, and ``eval.py`` reports the accuracy.
"""

import os
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from laplax.data.errors import DataError
from laplax.data.lra import listops
from laplax.models import spec as spec_lib
from laplax.models.encoder import Encoder, posemb_sincos_1d

from helpers.runs import ROOT, read_metrics, run_in_process

CONFIG = os.path.join(ROOT, "configs", "nystrom_listops.py")


def release_value(t):
  """The release's ``to_value`` on a generated tree (its pairs, not the text)."""
  if not isinstance(t, tuple):
    return t
  left, right = release_value(t[0]), release_value(t[1])
  if left in listops.OPERATORS:
    return (left, [right])
  if right == listops.END:
    op, args = left
    return {
      listops.MIN: min,
      listops.MAX: max,
      listops.MED: lambda a: int(np.median(a)),
      listops.SUM_MOD: lambda a: int(np.sum(a) % 10),
    }[op](args)
  return (left[0], left[1] + [right])


def test_generated_expressions_follow_the_release_rules():
  rng = random.Random(0)
  for _ in range(300):
    tree, length = listops.generate_tree(rng, 1, 6, 5)
    text = listops.to_string(tree)
    words = text.split()
    assert listops.evaluate(words) == release_value(tree)
    # length: one per digit, two per operator (the operator and its "]")
    assert length == sum(w.isdigit() for w in words) + 2 * sum(
      w in listops.OPERATORS for w in words
    )
  rows = listops.generate(50, seed=1, min_length=20, max_length=60)
  assert len({s for s, _ in rows}) == 50
  for s, t in rows:
    n = sum(1 if w.isdigit() else 2 for w in s.split() if w not in ("(", ")", "]"))
    assert 20 < n < 60 and 0 <= t <= 9
  assert listops.evaluate("( ( ( [SM 7 ) 8 ) ] )".split()) == 5
  assert listops.evaluate("( ( ( ( [MED 1 ) 9 ) 2 ) ] )".split()) == 2


def test_cli_round_trip_and_malformed_files(tmp_path, capsys):
  out = tmp_path / "lo"
  args = ["--out", str(out), "--num_train", "30", "--num_val", "5", "--num_test", "5"]
  args += ["--min_length", "10", "--max_length", "40"]
  assert listops.main(args) == 0
  rows = listops.read_tsv(str(out / "basic_train.tsv"))
  assert len(rows) == 30
  assert all(listops.evaluate(s.split()) == t for s, t in rows)
  ids, mask, labels = listops.load_split(str(out), "val", 64)
  assert ids.shape == (5, 64) and mask.sum(1).min() > 0 and labels.shape == (5,)
  first = listops.read_tsv(str(out / "basic_val.tsv"))[0][0]
  words = [w.lstrip("[") for w in first.split() if w not in ("(", ")")]
  assert [list(listops.VOCAB)[i] for i in ids[0][mask[0]]] == words
  ids, mask, _ = listops.load_split(str(out), "val", 64, closers=False)
  words = [w for w in words if w != "]"]
  assert [list(listops.VOCAB)[i] for i in ids[0][mask[0]]] == words
  before = (out / "basic_train.tsv").read_text()
  assert listops.main(args) == 2  # exists: nothing overwritten
  assert (out / "basic_train.tsv").read_text() == before
  assert "exists" in capsys.readouterr().err
  bad = tmp_path / "bad.tsv"
  bad.write_text("Source\tTarget\n( ( [MAX 1 ) ] )\t12\n")
  with pytest.raises(DataError, match=r"bad.tsv:2: expected") as e:
    listops.read_tsv(str(bad))
  assert "\n" not in str(e.value)
  bad.write_text("a,b\n")
  with pytest.raises(DataError, match="header"):
    listops.read_tsv(str(bad))


def test_closing_brackets_are_tokens_as_the_fixed_release_pipeline():
  """LRA c209b2a's pipeline (``]`` -> ``X``, parentheses removed, the
  operators reserved words): bracket placement changes the ids; the pipeline
  before it (``closers=False``) cannot tell them apart."""
  a = "( ( ( ( [MAX 2 ) ( ( ( [MIN 3 ) 4 ) ] ) ) 5 ) ] )"  # [MAX 2 [MIN 3 4 ] 5 ]
  b = "( ( ( [MAX 2 ) ( ( ( ( [MIN 3 ) 4 ) 5 ) ] ) ) ] )"  # [MAX 2 [MIN 3 4 5 ] ]
  assert listops.evaluate(a.split()) == 5 and listops.evaluate(b.split()) == 3
  v = listops.VOCAB
  assert listops.encode(a, 10).tolist() == [
    v["MAX"], v["2"], v["MIN"], v["3"], v["4"], v["]"], v["5"], v["]"], 0, 0
  ]  # fmt: skip
  assert listops.encode(b, 8).tolist() != listops.encode(a, 8).tolist()
  assert listops.encode(a, 8, closers=False).tolist() == listops.encode(b, 8, False).tolist()
  assert listops.encode(a, 8, False).tolist() == [v[w] for w in "MAX 2 MIN 3 4 5".split()] + [0, 0]
  assert listops.words(a) == "[MAX 2 [MIN 3 4 X 5 X".split()
  assert listops.encode(a, 3).tolist() == [v["MAX"], v["2"], v["MIN"]]  # cut
  assert max(listops.VOCAB.values()) < listops.vocab_size(True) == 16 <= 32
  assert listops.vocab_size(False) == 15
  for s, _ in listops.generate(40, seed=3, min_length=20, max_length=200):
    n = sum(1 if w.isdigit() else 2 for w in s.split() if w not in ("(", ")", "]"))
    ids = listops.encode(s, 256)
    assert (ids != 0).sum() == n  # the generator's length rule
    assert (ids == v["]"]).sum() == (ids >= v["MIN"]).sum() - (ids == v["]"]).sum()
  with pytest.raises(DataError, match="'MAX' is not one of"):
    listops.encode("MAX 2 3 ]", 8)  # the operator without its bracket
  with pytest.raises(DataError, match="'X' is not one of"):
    listops.encode("[MAX 2 3 X", 8, closers=False)


@pytest.mark.slow
def test_encoder_sincos_and_padding():
  pe = posemb_sincos_1d(5, 4)[0]
  assert np.allclose(pe[3], [np.sin(3), np.cos(3), np.sin(3e-2), np.cos(3e-2)], atol=1e-6)
  # Padded tokens change nothing but the mean's divisor: logits of a padded
  # sequence equal those of the same tokens with other padding ids.
  for impl in ("xla", "nystrom"):
    spec = spec_lib.build(
      "encoder",
      width=16,
      depth=1,
      num_heads=2,
      mlp_dim=16,
      vocab_size=15,
      max_length=32,
      implementation=impl,
      num_landmarks=4,
      conv_kernel_size=3,
      nystrom_padding="zero",
      num_laplacian_heads=1,
    )
    model = Encoder(spec, num_classes=3)
    ids = jnp.asarray(np.random.default_rng(0).integers(1, 15, (2, 32)), jnp.int32)
    mask = jnp.arange(32)[None] < jnp.asarray([[32], [20]])
    params = model.init(jax.random.key(0), ids, mask)
    a, _ = model.apply(params, ids, mask)
    b, _ = model.apply(params, jnp.where(mask, ids, 7), mask)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


@pytest.fixture(scope="module")
def listops_dir(tmp_path_factory):
  out = tmp_path_factory.mktemp("listops")
  args = ["--out", str(out), "--num_train", "64", "--num_val", "16", "--num_test", "16"]
  assert listops.main(args + ["--min_length", "20", "--max_length", "64", "--seed", "3"]) == 0
  return out


@pytest.mark.parametrize(
  "arg",
  [
    "size=cpu,laplacian=1,spectral=10.0",
    pytest.param("size=cpu,attention=softmax,laplacian=2", marks=pytest.mark.slow),
  ],
)
@pytest.mark.slow
def test_config_trains_and_evaluates(arg, listops_dir, tmp_path, capfd):
  workdir = tmp_path / "run"
  tiny = [
    f"--config.data.data_dir={listops_dir}",
    "--config.data.max_length=64",
    "--config.model.max_length=64",
    "--config.total_steps=4",
    "--config.batch_size=8",
    "--config.eval_batch_size=16",
    "--config.log_every=2",
    "--config.eval_every=4",
    "--config.checkpoint_every=4",
  ]
  r = run_in_process(
    ["train.py", "--config", f"{CONFIG}:{arg}", "--workdir", str(workdir)] + tiny, capfd
  )
  assert r.returncode == 0, r.stderr[-2000:]
  metrics = read_metrics(workdir)
  losses = [m["loss"] for m in metrics if "loss" in m]
  assert losses and all(np.isfinite(losses))
  r = run_in_process(["eval.py", "--workdir", str(workdir)], capfd)
  assert r.returncode == 0, r.stderr[-2000:]
  assert "accuracy" in r.stdout + r.stderr
