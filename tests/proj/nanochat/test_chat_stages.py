"""nanochat's mid-training and SFT stages (laplax.proj.nanochat.data.mixture,
laplax.proj.nanochat.stages, configs/gpt_{d20,tiny}_{mid,sft}.py): the batches
token by token against references written from nanochat's rules, the
learning-rate schedules' closed forms, the masked loss, the chain pretrain ->
mid -> SFT through init_from, an SFT run resumed bitwise, and bad input."""

import json
import os
import random
import shutil

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from laplax import optim  # noqa: E402
from laplax.data.errors import DataError  # noqa: E402
from laplax.data.text import nanochat_tokenizer as nt  # noqa: E402
from laplax.proj.nanochat.data import fixtures as chat_fixtures
from laplax.proj.nanochat.data import mixture as chat_mixture
from laplax.proj.nanochat.data import render as chat  # noqa: E402

from helpers.configs import load
from helpers.lm import one_line_error
from helpers.resume import assert_bitwise_equal, saved_state
from helpers.runs import ROOT, run_in_process

# Byte tokenizer with nanochat's special tokens at 256..264.
TOK = nt.NanochatTokenizer.from_ranks({bytes([b]): b for b in range(256)})
AE = chat.chat_tokens(TOK)["<|assistant_end|>"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("chat_data")
  chat_fixtures.write(str(d), scale=0.05)
  return d


def data_config(name, data, **kw):
  c = chat_mixture.default_config(name)
  c.source_dir = str(data)
  c.update(kw)
  return c


# --------------------------------------------------------------------------
# The mixture and the batches.


def test_mixture_is_nanochats_shuffle_of_the_shuffled_sets(data):
  c = data_config("chat_sft", data, smoltalk_stop=5)
  sets = [
    chat_mixture.SOURCES[s].reader(chat_mixture.split_files(c, s, "train"))
    for s in ("arc_easy", "arc_challenge", "gsm8k", "smoltalk")
  ]
  # Hugging Face's shuffle(seed=42) is numpy's default_rng(42).permutation.
  sets = [[x[i] for i in np.random.default_rng(42).permutation(len(x))] for x in sets]
  sets[3] = sets[3][:5]
  pairs = [(t, i) for t, x in enumerate(sets) for i in range(len(x))]
  random.Random(42).shuffle(pairs)
  assert chat_mixture.mixture(c, "train") == [sets[t][i] for t, i in pairs]


def reference_sft(rendered):
  """nanochat's collate, token by token: pad to the longest - 1 with
  <|assistant_end|>, target t = ids[t + 1] if mask[t + 1] else -1."""
  width = max(len(ids) for ids, _ in rendered) - 1
  inputs = [[AE] * width for _ in rendered]
  targets = [[-1] * width for _ in rendered]
  for r, (ids, mask) in enumerate(rendered):
    for t in range(len(ids) - 1):
      inputs[r][t] = int(ids[t])
      targets[r][t] = int(ids[t + 1]) if mask[t + 1] else -1
  return np.array(inputs), np.array(targets)


@pytest.mark.parametrize("process_index,process_count", [(0, 1), (1, 2)])
def test_sft_batches_token_by_token(data, process_index, process_count):
  c, seq_len, rows = data_config("chat_sft", data), 160, 4 // process_count
  items = chat_mixture.mixture(c, "train")
  it = iter(
    chat_mixture.train_dataset(
      c,
      TOK,
      batch_size=rows,
      seq_len=seq_len,
      process_index=process_index,
      process_count=process_count,
    )
  )
  for k in range(2):
    batch = next(it)
    assert set(batch) == {"tokens", "targets"}
    first = k * 4 + process_index * rows  # row r of global batch k: conversation k B + r
    rendered = [chat.render_conversation(TOK, items[first + r], seq_len + 1) for r in range(rows)]
    inputs, targets = reference_sft(rendered)
    width = inputs.shape[1]
    np.testing.assert_array_equal(batch["tokens"][:, :width], inputs)
    np.testing.assert_array_equal(batch["targets"][:, :width], targets)
    assert (batch["tokens"][:, width:] == AE).all() and (batch["targets"][:, width:] == -1).all()
    assert (targets >= 0).any()


def test_mid_batches_are_packed_streams_without_mask(data):
  c, seq_len = data_config("chat_mid", data, streams=2), 32
  items = chat_mixture.mixture(c, "train")
  it = iter(chat_mixture.train_dataset(c, TOK, batch_size=4, seq_len=seq_len))
  # Reference: stream s renders conversations s, s + 2, ...; a pop is 2 x 32 + 1 tokens.
  streams = [
    np.concatenate(
      [chat.render_conversation(TOK, items[(s + 2 * k) % len(items)])[0] for k in range(8)]
    )
    for s in range(2)
  ]
  for k in range(2):
    batch = next(it)
    assert set(batch) == {"tokens"}  # no loss mask: every next token is a target
    for s in range(2):
      pop = streams[s][k * 65 : (k + 1) * 65]
      expected = np.stack([pop[i * 32 : i * 32 + 33] for i in range(2)])
      np.testing.assert_array_equal(batch["tokens"][2 * s : 2 * s + 2], expected)
  state = it.get_state()
  again = iter(chat_mixture.train_dataset(c, TOK, batch_size=4, seq_len=seq_len))
  again.set_state(json.loads(json.dumps(state)))
  np.testing.assert_array_equal(next(again)["tokens"], next(it)["tokens"])


def test_mid_batches_on_more_processes_than_streams_are_the_one_process_batches(data):
  """2 streams on 4 processes (gpt_d20_mid's 8 on a 16-host slice): each
  process keeps its row of its stream's two, in process order the batch."""
  c, seq_len = data_config("chat_mid", data, streams=2), 32
  whole = iter(chat_mixture.train_dataset(c, TOK, batch_size=4, seq_len=seq_len))
  parts = [
    iter(
      chat_mixture.train_dataset(
        c,
        TOK,
        batch_size=1,
        seq_len=seq_len,
        process_index=p,
        process_count=4,
        gather=lambda local: [local],
      )
    )
    for p in range(4)
  ]
  for _ in range(2):
    np.testing.assert_array_equal(
      np.concatenate([next(p)["tokens"] for p in parts]), next(whole)["tokens"]
    )


def test_epoch_steps_stay_within_one_pass_of_every_stream(data):
  c, seq_len = data_config("chat_mid", data, streams=2), 32
  items = chat_mixture.mixture(c, "train")
  n = chat_mixture.epoch_steps(c, TOK, batch_size=4, seq_len=seq_len)
  it = iter(chat_mixture.train_dataset(c, TOK, batch_size=4, seq_len=seq_len))
  for _ in range(n):
    next(it)
  positions = it.get_state()["positions"]
  assert all(int(s) + 2 * k < len(items) for s, (k, _) in positions.items())
  # One more step would need a token of the second pass of some stream.
  fewest = min(
    sum(len(chat.render_conversation(TOK, items[i])[0]) for i in range(s, len(items), 2))
    for s in range(2)
  )
  assert n * 65 <= fewest < (n + 1) * 65


def test_sft_eval_mask_is_the_assistant_targets(data):
  c = data_config("chat_sft", data, max_eval_conversations=3)
  batches = list(chat_mixture.eval_batches(c, TOK, batch_size=2, seq_len=200, train_batch_size=2))
  items = chat_mixture.mixture(c, "validation")[:3]
  assert len(batches) == 2 and batches[1]["mask"][1].sum() == 0  # padding row
  for n, item in enumerate(items):
    ids, mask = chat.render_conversation(TOK, item, 201)
    row, r = batches[n // 2], n % 2
    expected = np.zeros(200)
    expected[: len(ids) - 1] = mask[1:]
    np.testing.assert_array_equal(row["mask"][r], expected)
    np.testing.assert_array_equal(row["tokens"][r, : len(ids)], ids)


# --------------------------------------------------------------------------
# Loss and schedules.


def test_masked_loss_is_the_mean_over_valid_targets():
  import jax

  from laplax import tasks

  c = load("gpt_tiny_sft")
  c.model.update(width=16, depth=1, num_heads=2, mlp_dim=32, max_length=8)
  task = tasks.LanguageModelTask(c, TOK)
  assert set(task.batch_spec(2)) == {"tokens", "targets"}
  params = task.init(jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 265, (2, 9)).astype(np.int32)
  targets = np.where(rng.random((2, 8)) < 0.5, rng.integers(0, 265, (2, 8)), -1).astype(np.int32)
  loss, _ = task.loss(params, {"tokens": tokens, "targets": targets}, jax.random.PRNGKey(1))
  logits = np.asarray(task.model.apply({"params": params}, tokens[:, :-1])[0], np.float64)
  logp = (
    logits
    - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
    - logits.max(-1, keepdims=True)
  )
  valid = targets >= 0
  expected = -logp[valid, targets[valid]].mean()
  np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
  none, _ = task.loss(
    params, {"tokens": tokens, "targets": np.full_like(targets, -1)}, jax.random.PRNGKey(1)
  )
  assert float(none) == 0.0


def lr_at(c, steps, key="muon_lr"):
  schedule = optim.learning_rate_schedule(c.optim, c.total_steps, peak=c.optim[key])
  return np.array([float(schedule(s)) for s in steps])


def test_sft_schedule_is_two_percent_decaying_over_651():
  c, base = load("gpt_d20_sft"), load("gpt_d20")
  assert c.total_steps == 650 and c.optim.grad_clip is None and c.batch_size == 32
  assert c.optim.muon_momentum_start == c.optim.muon_momentum == 0.95
  steps = np.array([0, 1, 325, 649])
  for key in ("muon_lr", "embedding_lr", "unembedding_lr"):
    np.testing.assert_allclose(
      lr_at(c, steps, key), base.optim[key] * 0.02 * (1 - steps / 651), rtol=1e-6
    )


def test_mid_schedules_rising_and_fixed():
  rising, fixed = load("gpt_d20_mid"), load("gpt_d20_mid", "schedule=fixed")
  assert rising.total_steps == 800 and rising.optim.grad_clip is None
  steps = np.array([0, 1, 399, 640, 700, 799, 900])
  np.testing.assert_allclose(
    lr_at(rising, steps), 0.02 * np.minimum(1, (steps + 1) / 800), rtol=1e-6
  )
  # 1 until 80% of the steps, then linear to 0 at the end: (800 - it) / 160.
  np.testing.assert_allclose(
    lr_at(fixed, steps[:6]), 0.02 * np.array([1, 1, 1, 1, 100 / 160, 1 / 160]), rtol=1e-6
  )


# --------------------------------------------------------------------------
# train.py: pretrain -> mid -> SFT, resume, bad input.

TINY = [
  "--config.model.width=32",
  "--config.model.depth=1",
  "--config.model.num_heads=2",
  "--config.model.mlp_dim=64",
  "--config.model.max_length=128",
  "--config.batch_size=4",
  "--config.eval_batch_size=4",
  "--config.eval.sample_tokens=0",
]
STAGE = ["--config.batch_size=4", "--config.eval_batch_size=4"]


def stage(name, workdir, init_from, data, *extra):
  return (
    [
      "train.py",
      "--config",
      os.path.join(ROOT, "configs", f"gpt_tiny_{name}.py"),
      "--workdir",
      str(workdir),
      f"--config.init_from={init_from}",
      f"--config.data.source_dir={data}",
    ]
    + STAGE
    + list(extra)
  )


@pytest.fixture(scope="module")
def chain(tmp_path_factory, data):
  root = tmp_path_factory.mktemp("stages")
  corpus = root / "corpus"
  corpus.mkdir()
  for name in "abc":
    (corpus / f"{name}.txt").write_text("Which is hot? The sun is hot. 2+2=4. " * 40)
  base = root / "base"
  argv = [
    "train.py",
    "--config",
    os.path.join(ROOT, "configs", "gpt_shakespeare.py"),
    "--workdir",
    str(base),
    f"--config.data.source_dir={corpus}",
    f"--config.data.data_dir={root / 'tfds'}",
    "--config.data.tokenizer=nanochat",
    "--config.data.vocab_size=270",
    "--config.total_steps=2",
    "--config.eval_every=2",
    "--config.checkpoint_every=2",
  ] + TINY
  assert run_in_process(argv).returncode == 0
  mid = root / "mid"
  assert (
    run_in_process(
      stage(
        "mid",
        mid,
        base,
        data,
        "--config.total_steps=2",
        "--config.eval_every=2",
        "--config.checkpoint_every=2",
        "--config.data.max_eval_tokens=1024",
      )
    ).returncode
    == 0
  )
  sft = root / "sft"
  assert (
    run_in_process(
      stage(
        "sft",
        sft,
        mid,
        data,
        "--config.total_steps=4",
        "--config.eval_every=4",
        "--config.checkpoint_every=2",
        "--config.data.max_eval_conversations=4",
      )
    ).returncode
    == 0
  )
  return root, base, mid, sft


@pytest.mark.slow
def test_each_stage_starts_from_the_previous(chain):
  _, base, mid, sft = chain
  configs = {w: json.loads((w / "config.json").read_text()) for w in (base, mid, sft)}
  assert configs[mid]["model"] == configs[base]["model"] == configs[sft]["model"]
  assert configs[mid]["data"]["name"] == "chat_mid" and configs[sft]["data"]["name"] == "chat_sft"
  tok = (base / "nanochat_tokenizer.json").read_bytes()
  assert (mid / "nanochat_tokenizer.json").read_bytes() == tok
  assert (sft / "nanochat_tokenizer.json").read_bytes() == tok
  for previous, run in ((base, mid), (mid, sft)):
    _, end = saved_state(previous)
    _, start = saved_state(run, 0)
    for name, value in end.items():
      if name.startswith("params/"):
        np.testing.assert_array_equal(start[name], value, err_msg=name)
  _, state = saved_state(sft, 0)  # a fresh optimizer state: every moment 0
  moments = [
    v
    for k, v in state.items()
    if k.startswith("opt_state/") and np.issubdtype(v.dtype, np.floating)
  ]
  assert moments and not any(np.any(v) for v in moments)


@pytest.mark.slow
def test_sft_resumes_bitwise(chain, data, tmp_path):
  _, _, mid, sft = chain
  run = tmp_path / "sft"
  shutil.copytree(sft, run)
  _, reference = saved_state(sft, 4)
  shutil.rmtree(run / "checkpoints" / "4")  # resume from step 2 and redo steps 3-4
  assert (
    run_in_process(
      stage(
        "sft",
        run,
        mid,
        data,
        "--config.total_steps=4",
        "--config.eval_every=4",
        "--config.checkpoint_every=2",
        "--config.data.max_eval_conversations=4",
      )
    ).returncode
    == 0
  )
  step, resumed = saved_state(run, 4)
  assert step == 4
  assert_bitwise_equal(resumed, reference, "SFT resumed at step 2")


def _bad_data(root, data, how):
  bad = root / f"data_{how}"
  shutil.copytree(data, bad)
  if how == "jsonl":
    train = bad / "gsm8k" / "main" / "train-00000-of-00001.parquet"
    rows = pq.read_table(train).to_pylist()
    train.unlink()
    (train.parent / "train.jsonl").write_text(json.dumps(rows[0]) + '\n{"question": 1,\n')
  else:
    train = bad / "ai2_arc" / "ARC-Easy" / "train-00000-of-00001.parquet"
    pq.write_table(pq.read_table(train).drop(["answerKey"]), train)
  return bad


@pytest.mark.parametrize(
  "case,fragment",
  [
    ("jsonl", "train.jsonl:2: not valid JSON"),
    ("column", "has no column 'answerKey'"),
    ("tokenizer", "no chat special tokens"),
    ("width", "model.* keys"),
    ("no_target", "config.data.max_conversation_tokens=8"),
  ],
)
@pytest.mark.slow
def test_bad_input_is_one_line_exit_2_nothing_written(chain, data, tmp_path, capfd, case, fragment):
  root, base, mid, _ = chain
  init, extra, source = mid, [], data
  if case in ("jsonl", "column"):
    source = _bad_data(tmp_path, data, case)
  if case == "tokenizer":  # a byte-level run as init_from
    init = tmp_path / "byte_run"
    shutil.copytree(base, init)
    config = json.loads((init / "config.json").read_text())
    config["data"].update(tokenizer="byte", vocab_size=256)
    (init / "config.json").write_text(json.dumps(config))
    (init / "nanochat_tokenizer.json").unlink()
  if case == "width":
    extra = ["--config.model.width=64"]
  if case == "no_target":  # nanochat PR #834: every assistant token cut off
    extra = ["--config.data.max_conversation_tokens=8"]
  workdir = tmp_path / "new_run"
  name = "mid" if case == "jsonl" else "sft"
  r = run_in_process(stage(name, workdir, init, source, "--config.total_steps=2", *extra), capfd)
  assert fragment in one_line_error(r)
  assert not workdir.exists()


def test_no_target_is_refused_before_training_and_names_its_keys(data):
  """An SFT split whose rendered conversations keep no assistant target: the
  check refuses it, naming both limits; one that keeps targets passes."""
  c = data_config("chat_sft", data, max_conversation_tokens=8)
  with pytest.raises(DataError, match=r"SFT training split .* first 8 tokens") as e:
    chat_mixture.check(c, TOK, seq_len=32)
  assert "config.data.max_conversation_tokens=8" in str(e.value)
  assert "config.model.max_length + 1=33" in str(e.value)
  # The same limit reached through the context: T + 1 = 8 tokens.
  with pytest.raises(DataError, match=r"first 8 tokens"):
    chat_mixture.check(data_config("chat_sft", data), TOK, seq_len=7)
  chat_mixture.check(data_config("chat_sft", data), TOK, seq_len=2047)  # targets: passes
  # Every conversation starts <|bos|><|user_start|>: with 8 tokens no
  # assistant token is reached, checked from the rendering itself.
  items = chat_mixture.mixture(c, "train")
  assert not any(chat.render_conversation(TOK, x, 8)[1][1:].any() for x in items)
  assert any(chat.render_conversation(TOK, x, 2048)[1][1:].any() for x in items)


def test_eval_py_on_a_run_whose_eval_counts_no_target_is_one_line(chain, data, tmp_path, capfd):
  """eval.py on an SFT workdir whose validation conversations keep no
  assistant target: one line and exit 2 instead of a ZeroDivisionError."""
  _, _, _, sft = chain
  run = tmp_path / "sft"
  shutil.copytree(sft, run)
  config = json.loads((run / "config.json").read_text())
  config["data"]["max_conversation_tokens"] = 8
  (run / "config.json").write_text(json.dumps(config))
  r = run_in_process(["eval.py", "--workdir", str(run)], capfd)
  assert "counted no target token" in one_line_error(r)
  assert not (run / "eval.json").exists()


def test_bad_mixture_errors_name_the_expected_path(tmp_path):
  c = data_config("chat_sft", tmp_path)
  with pytest.raises(DataError, match=r"ai2_arc/ARC-Easy/train-00000-of-00001.parquet") as e:
    chat_mixture.mixture(c, "train")
  assert "\n" not in str(e.value)


def test_the_fork_s_sft_mixture_repeats_mmlu_and_gsm8k(data):
  """data.sft_mixture=nanochat-fork: SmolTalk + MMLU auxiliary_train x 3 +
  GSM8K x 4 in the fork's TaskMixture order; validation mid-training's."""
  c = data_config("chat_sft", data, sft_mixture="nanochat-fork")
  read = {
    s: chat_mixture.SOURCES[s].reader(chat_mixture.split_files(c, s, "train"))
    for s in ("smoltalk", "mmlu_auxiliary", "gsm8k")
  }
  read = {s: [x[i] for i in np.random.default_rng(42).permutation(len(x))] for s, x in read.items()}
  sets = [read["smoltalk"]] + [read["mmlu_auxiliary"]] * 3 + [read["gsm8k"]] * 4
  pairs = [(t, i) for t, x in enumerate(sets) for i in range(len(x))]
  random.Random(42).shuffle(pairs)
  assert chat_mixture.mixture(c, "train") == [sets[t][i] for t, i in pairs]
  mid = data_config("chat_mid", data)
  assert chat_mixture.mixture(c, "validation") == chat_mixture.mixture(mid, "validation")
  with pytest.raises(DataError, match="sft_mixture='fork' is unknown"):
    chat_mixture.mixture(data_config("chat_sft", data, sft_mixture="fork"), "train")
  with pytest.raises(DataError, match="is for SFT"):
    chat_mixture.prepare(data_config("chat_mid", data, sft_mixture="nanochat-fork"), None)
