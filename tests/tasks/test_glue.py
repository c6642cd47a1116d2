"""GLUE fine-tuning (laplax.tasks.glue): the metrics against scikit-learn and
SciPy, cramming's average, BERT's pair encoding against Hugging Face
tokenizers', the pipeline on tfds.testing.mock_data and a fine-tune from a
tiny pre-trained workdir whose eval.py writes the metric."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import scipy.stats
import sklearn.metrics
import tensorflow_datasets as tfds
import tokenizers

from laplax.tasks import glue

from helpers.configs import load

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tokenizer() -> tokenizers.Tokenizer:
  """A WordPiece of the special tokens, the letters and their ``##`` pieces
  (mock_data's texts are letters and spaces)."""
  letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
  vocab = {t: i for i, t in enumerate(SPECIAL + letters + ["##" + c for c in letters])}
  t = tokenizers.Tokenizer(tokenizers.models.WordPiece(vocab, unk_token="[UNK]"))
  t.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
  t.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
  return t


@pytest.mark.parametrize("seed", [0, 1])
def test_metrics_are_sklearn_and_scipy(seed):
  rng = np.random.default_rng(seed)
  y, p = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
  np.testing.assert_allclose(glue.accuracy(y, p), sklearn.metrics.accuracy_score(y, p))
  np.testing.assert_allclose(glue.f1(y, p), sklearn.metrics.f1_score(y, p), rtol=1e-12)
  np.testing.assert_allclose(
    glue.matthews_correlation(y, p), sklearn.metrics.matthews_corrcoef(y, p), rtol=1e-12
  )
  x, z = rng.normal(size=300), rng.normal(size=300)
  z = np.round(z + x, 1)  # ties for the ranks
  np.testing.assert_allclose(glue.pearson(x, z), scipy.stats.pearsonr(x, z)[0], rtol=1e-12)
  np.testing.assert_allclose(glue.spearman(x, z), scipy.stats.spearmanr(x, z)[0], rtol=1e-12)
  np.testing.assert_allclose(glue.average_ranks(z), scipy.stats.rankdata(z))
  # degenerate: one class predicted, no positives
  zeros = np.zeros(10, int)
  assert glue.matthews_correlation(zeros, zeros) == sklearn.metrics.matthews_corrcoef(zeros, zeros)
  assert glue.f1(zeros, zeros) == sklearn.metrics.f1_score(zeros, zeros, zero_division=0)


def test_scores_name_the_official_metrics():
  y = np.array([0, 1, 1, 0, 1])
  p = np.array([0, 1, 0, 0, 1])
  assert set(glue.scores("cola", y, p)) == {"matthews_correlation"}
  assert set(glue.scores("mrpc", y, p)) == {"accuracy", "f1"}
  assert set(glue.scores("qqp", y, p)) == {"accuracy", "f1"}
  assert set(glue.scores("stsb", y * 1.0, p * 1.0)) == {"pearson", "spearmanr"}
  for t in ("sst2", "mnli", "qnli", "rte", "wnli"):
    assert glue.scores(t, y, p) == {"accuracy": 0.8}


def test_glue_average_is_crammings_nine_numbers_without_wnli():
  results = {
    "cola": {"matthews_correlation": 0.1},
    "mnli": {"accuracy": 0.2, "accuracy_mm": 0.3},
    "mrpc": {"f1": 0.4, "accuracy": 9.0},
    "qnli": {"accuracy": 0.5},
    "qqp": {"f1": 0.6, "accuracy": 9.0},
    "rte": {"accuracy": 0.7},
    "sst2": {"accuracy": 0.8},
    "stsb": {"pearson": 0.9, "spearmanr": 9.0},
    "wnli": {"accuracy": 9.0},
  }
  np.testing.assert_allclose(glue.glue_average(results), 4.5 / 9)
  del results["qqp"]
  with pytest.raises(KeyError):
    glue.glue_average(results)


def test_pairs_are_encoded_as_hugging_face_tokenizers_does():
  """[CLS] a [SEP] b [SEP] with longest_first truncation and segment ids,
  against the tokenizers library's own template and truncation."""
  ref = _tokenizer()
  ref.post_processor = tokenizers.processors.TemplateProcessing(
    single="[CLS] $A [SEP]",
    pair="[CLS] $A [SEP] $B:1 [SEP]:1",
    special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
  )
  ref.enable_truncation(12, strategy="longest_first")
  a = ["abc def", "a", "abcdefghij klm", "ab cd ef gh ij"]
  b = ["xy", "qrstuvwxyz abc", "mnopqrstuv", "k"]
  tokens, types, mask = glue.encode_pairs(_tokenizer(), [a, b], 12)
  for i, e in enumerate(ref.encode_batch(list(zip(a, b)))):
    n = len(e.ids)
    assert mask[i].sum() == n
    np.testing.assert_array_equal(tokens[i, :n], e.ids)
    np.testing.assert_array_equal(types[i, :n], e.type_ids)
    assert (tokens[i, n:] == 0).all()
  tokens, types, mask = glue.encode_pairs(_tokenizer(), [a], 6)
  for i, e in enumerate(ref.encode_batch(a)):
    np.testing.assert_array_equal(tokens[i, : len(e.ids)][:6], (e.ids[:5] + [3])[: len(e.ids)])


def _config(task, tmp_path, **extra):
  c = load("bert_glue", f"task={task}")
  c.model.update(width=32, depth=2, num_heads=2, mlp_dim=64, max_length=32, num_laplacian_heads=1)
  c.model.spectral.enabled = True
  c.data.update(max_length=32, data_dir=str(tmp_path / "tfds"))
  c.update(batch_size=4, eval_batch_size=8, total_steps=4, log_every=2, eval_every=4)
  c.update(checkpoint_every=4)
  c.optim.warmup_steps = 1
  c.update(extra)
  return c


@pytest.fixture
def workdir(tmp_path):
  d = tmp_path / "w"
  d.mkdir()
  _tokenizer().save(str(d / "tokenizer.json"))
  return str(d)


@pytest.mark.parametrize("task", list(glue.TASKS))
def test_every_task_reads_its_mock_builder(task, tmp_path, workdir):
  with tfds.testing.mock_data(num_examples=6):
    t = glue.GLUETask.from_data(_config(task, tmp_path), workdir)
    batch = next(iter(t.train_dataset()))
    splits = {s: list(t._batches(s)) for s in t.eval_splits.values()}
  spec = t.batch_spec(4)
  assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
    k: (v.shape, v.dtype) for k, v in spec.items()
  }
  assert (batch["tokens"][:, 0] == 2).all() and (batch["mask"][:, 0] == 1).all()
  seps = (batch["tokens"] == 3).sum(1)
  assert (seps == len(t.features)).all()
  for batches in splits.values():
    assert sum(float(b["weight"].sum()) for b in batches) == 6
  if task == "stsb":
    assert t.num_labels == 1 and ((batch["label"] >= 0) & (batch["label"] <= 5)).all()
  else:
    assert set(np.unique(batch["label"])) <= set(range(t.num_labels))


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("task", ["cola", "stsb", "mnli"])
def test_evaluate_scores_the_models_predictions(task, tmp_path, workdir):
  """evaluate() = scores() of the model's argmax (STS-B: its output) on every
  validation example, recomputed here batch by batch."""
  from laplax.evaluators import registry

  with tfds.testing.mock_data(num_examples=11):
    config = _config(task, tmp_path)
    t = glue.GLUETask.from_data(config, workdir)
    params = t.init(jax.random.PRNGKey(0))
    state = type("S", (), {"params": params})()
    (evaluator,) = registry.build(t, registry.EVAL)
    got = evaluator.run(state, registry.Context())
    loss, _ = t.loss(params, next(iter(t.train_dataset())), jax.random.PRNGKey(1))
    for suffix, split in t.eval_splits.items():
      labels, outputs = [], []
      for b in t._batches(split):
        logits, _ = t.model.apply({"params": params}, b["tokens"], b["types"], b["mask"])
        out = logits[:, 0] if task == "stsb" else logits.argmax(-1)
        keep = b["weight"] > 0
        labels.append(b["label"][keep])
        outputs.append(np.asarray(out)[keep])
      y, p = np.concatenate(labels), np.concatenate(outputs)
      if task != "stsb":
        y = y.astype(int)
      # The evaluator's outputs come from the jitted step, these from eager ops:
      # float32 rounding apart (~1e-7 of each STS-B output), which a correlation
      # near 0 of 11 outputs turns into up to ~1e-6 absolute (seen: 1.6e-6).
      for k, v in glue.scores(task, y, p).items():
        np.testing.assert_allclose(got[k + suffix], v, rtol=1e-5, atol=1e-5)
      assert got["num_examples" + suffix] == 11
  assert np.isfinite(float(loss))


@pytest.mark.slow
@pytest.mark.subprocess
def test_fine_tune_from_a_pretrained_workdir_writes_the_metric(tmp_path):
  """A 2-step masked-LM run, then a 4-step CoLA fine-tune from it
  (init_from: encoder weights copied, pooler and classifier new), then
  eval.py (on the same mock data) writes the Matthews correlation."""
  from test_mlm import TEXT

  from laplax.train import finetune, loop
  from laplax.workdir import checkpoint as ckpt_lib

  corpus = tmp_path / "corpus"
  corpus.mkdir()
  for i, name in enumerate(("a", "b", "c")):
    (corpus / f"{name}.txt").write_text((TEXT[i:] + TEXT[:i]) * 40)
  pre = load("bert_cramming")
  pre.model.update(width=32, depth=2, num_heads=2, mlp_dim=64, max_length=32)
  pre.data.update(source_dir=str(corpus), data_dir=str(tmp_path / "tfds"), vocab_size=120)
  pre.update(batch_size=4, eval_batch_size=8, total_steps=2, eval_every=2, checkpoint_every=2)
  pre_dir, ft_dir = str(tmp_path / "pre"), str(tmp_path / "cola")
  loop.train_and_evaluate(pre, pre_dir)

  config = _config("cola", tmp_path, init_from=pre_dir)
  with config.unlocked():
    config.model = pre.model
  with tfds.testing.mock_data(num_examples=10):
    loop.train_and_evaluate(config, ft_dir)
  assert os.path.isfile(os.path.join(ft_dir, "tokenizer.json"))  # copied from init_from
  _, saved = ckpt_lib.Checkpointer(
    os.path.join(pre_dir, "checkpoints"), read_only=True
  ).restore_params()
  _, tuned = ckpt_lib.Checkpointer(
    os.path.join(ft_dir, "checkpoints"), read_only=True
  ).restore_params()
  assert set(tuned) - set(saved) == {"pooler", "classifier"}
  abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tuned)
  init = finetune.initial_params(pre_dir, abstract, fresh=glue.GLUETask.init_fresh)
  assert init["pooler"]["kernel"] is None
  np.testing.assert_array_equal(init["final_norm"]["scale"], saved["final_norm"]["scale"])

  script = (
    "import sys, runpy, tensorflow_datasets as tfds\n"
    "with tfds.testing.mock_data(num_examples=10):\n"
    f"  sys.argv = ['eval.py', '--workdir', {ft_dir!r}]\n"
    f"  runpy.run_path({os.path.join(ROOT, 'eval.py')!r}, run_name='__main__')\n"
  )
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  r = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT
  )
  assert r.returncode == 0, r.stderr[-2000:]
  with open(os.path.join(ft_dir, "eval.json")) as f:
    result = json.load(f)
  assert -1.0 <= result["matthews_correlation"] <= 1.0
  assert result["num_examples"] == 10 and result["step"] == 4


def test_stsb_spearman_of_nan_predictions_is_nan_as_scipy():
  labels, outputs = np.arange(6.0), np.array([0.1, np.nan, 2.0, 3.0, 4.0, 5.0])
  assert np.isnan(scipy.stats.spearmanr(labels, outputs)[0])
  assert np.isnan(glue.spearman(labels, outputs)) and np.isnan(glue.spearman(outputs, labels))
  assert np.isnan(glue.scores("stsb", labels, outputs)["spearmanr"])


def test_fine_tuning_drops_attention_probabilities_as_cramming():
  """With the hidden dropout off, two dropout keys give two losses exactly when
  ``glue.attention_dropout`` is on (cramming's ``attention.dropout_prob``)."""
  c = load("bert_glue")
  c.model.update(width=32, depth=1, num_heads=2, mlp_dim=64, pooler_dim=32)
  c.data.max_length = c.model.max_length = 16
  c.glue.dropout = 0.0
  rng = np.random.default_rng(0)
  batch = {
    "tokens": rng.integers(5, 64, (4, 16)).astype(np.int32),
    "types": np.zeros((4, 16), np.int32),
    "mask": np.ones((4, 16), np.int32),
    "label": np.array([0.0, 1.0, 1.0, 0.0], np.float32),
  }
  losses = {}
  for rate in (0.1, 0.0):
    c.glue.attention_dropout = rate
    task = glue.GLUETask.from_shapes(c, vocab_size=64)
    assert task.model.spec.attention.attention_dropout == rate
    params = task.init(jax.random.PRNGKey(0))
    losses[rate] = [float(task.loss(params, batch, jax.random.PRNGKey(k))[0]) for k in (1, 2)]
  assert losses[0.1][0] != losses[0.1][1]
  assert losses[0.0][0] == losses[0.0][1]
