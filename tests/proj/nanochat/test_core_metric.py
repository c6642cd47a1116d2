"""The CORE metric (laplax.proj.nanochat.evaluators.core) against a transcription of nanochat's
core_eval.py: its jinja templates, its token spans and its PyTorch scoring,
on a tiny eval bundle in DCLM's layout that the test writes (one task of
each kind), a byte tokenizer and a fixed random bigram model."""

import importlib.util
import math
import random

import numpy as np
import pytest

from laplax.data.errors import DataError
from laplax.proj.nanochat.evaluators import core

from helpers.core_bundle import write_bundle

pytestmark = pytest.mark.skipif(
  not (importlib.util.find_spec("torch") and importlib.util.find_spec("jinja2")),
  reason="the oracle: pip install -r requirements-test.txt",
)
BOS, VOCAB = 256, 257
MC = """
{%- for example in fewshot_examples -%}
{{ example.query }}{{ continuation_delimiter }}{{ example.choices[example.gold] }}

{% endfor -%}
{{ item.query }}{{ continuation_delimiter }}{{ choice }}""".strip()
SCHEMA = """
{%- for example in fewshot_examples -%}
{{ example.context_options[example.gold] }}{{ continuation_delimiter }}{{ example.continuation }}

{% endfor -%}
{{ context }}{{ continuation_delimiter }}{{ item.continuation }}""".strip()
LM = """
{%- for example in fewshot_examples -%}
{{ example.context | trim }}{{ continuation_delimiter }}{{ example.continuation }}

{% endfor -%}
{{ item.context | trim }}{{ continuation_delimiter }}{% if include_continuation %}{{ item.continuation }}{% endif %}""".strip()


def encode(text):
  return list(text.encode("utf-8"))


TABLE = np.random.default_rng(0).normal(0, 2, (VOCAB, VOCAB)).astype(np.float32)
for a, b in zip(b"e ca", b" cat"):
  TABLE[a, b] += 20.0  # so that " cat" is the greedy continuation


def bigram_logits(ids):
  return TABLE[np.asarray(ids)]


def _items(rng):
  words = ["the cat sat", "a dog ran", "he cat sat.", "birds fly", "fish swim", "the end"]
  mc = [
    dict(
      query=f"Q{i}: {rng.choice(words)}?", choices=[rng.choice(words) for _ in range(3)], gold=i % 3
    )
    for i in range(7)
  ]
  schema = [
    dict(
      context_options=[rng.choice(words) + " " for _ in range(2)],
      continuation=rng.choice(words),
      gold=i % 2,
    )
    for i in range(6)
  ]
  lm = [dict(context=f"  {rng.choice(words)} ", continuation=rng.choice(words)) for i in range(6)]
  lm.append(dict(context="the", continuation="cat"))
  return mc, schema, lm


def oracle_task(data, kind, shots, delim):
  """core_eval.py's evaluate_task, transcribed (torch cross-entropy, jinja templates)."""
  import torch
  from jinja2 import Template

  data = list(data)
  random.Random(1337).shuffle(data)
  right = 0
  for idx, item in enumerate(data):
    few = []
    if shots > 0:
      avail = [i for i in range(len(data)) if i != idx]
      few = [data[i] for i in random.Random(1234 + idx).sample(avail, shots)]
    ctx = dict(fewshot_examples=few, continuation_delimiter=delim, item=item)
    if kind == "multiple_choice":
      prompts = [Template(MC).render(choice=c, **ctx) for c in item["choices"]]
    elif kind == "schema":
      prompts = [Template(SCHEMA).render(context=c, **ctx) for c in item["context_options"]]
    else:
      prompts = [
        Template(LM).render(include_continuation=False, **ctx).strip(),
        Template(LM).render(include_continuation=True, **ctx),
      ]
    toks = [[BOS, *encode(p)] for p in prompts]
    if kind == "multiple_choice":
      n = min(map(len, toks))
      s = next((i for i in range(n) if len({t[i] for t in toks}) > 1), n)
      starts, ends = [s] * len(toks), [len(t) for t in toks]
    elif kind == "schema":
      n = min(map(len, toks))
      k = next((i for i, j in enumerate(range(-1, -n - 1, -1)) if len({t[j] for t in toks}) > 1), n)
      ends = [len(t) for t in toks]
      starts = [e - k for e in ends]
    else:
      starts, ends, toks = [len(toks[0])], [len(toks[1])], [toks[1]]
    width = max(map(len, toks))
    ids = torch.full((len(toks), width), BOS, dtype=torch.long)
    for i, t in enumerate(toks):
      ids[i, : len(t)] = torch.tensor(t)
    out = torch.from_numpy(bigram_logits(ids.numpy()))
    target = torch.roll(ids, -1, 1)
    losses = torch.nn.functional.cross_entropy(
      out.view(-1, VOCAB), target.view(-1), reduction="none"
    )
    losses = losses.view(len(toks), width)
    losses[:, -1] = float("nan")
    if kind == "language_modeling":
      s, e = starts[0], ends[0]
      right += bool(torch.all(out.argmax(-1)[0, s - 1 : e - 1] == ids[0, s:e]))
    else:
      means = [losses[i, s - 1 : e - 1].mean().item() for i, (s, e) in enumerate(zip(starts, ends))]
      right += means.index(min(means)) == item["gold"]
  return right / len(data)


def test_core_equals_core_eval_py_on_each_task_kind(tmp_path):
  mc, schema, lm = _items(random.Random(5))
  tasks = [
    ("mc_task", "multiple_choice", 2, " ", 25.0, mc),
    ("schema_task", "schema", 1, " ", 50.0, schema),
    ("lm_task", "language_modeling", 0, " ", 0.0, lm),
    ("lm_shots", "language_modeling", 2, ": ", 0.0, lm),
  ]
  bundle = core.read_bundle(write_bundle(tmp_path, tasks))
  assert [(t["label"], t["kind"], t["shots"], t["delim"]) for t in bundle] == [t[:4] for t in tasks]
  got = core.core_metric(bundle, core.forward_from_logits(bigram_logits), encode, BOS)
  want = {t[0]: oracle_task(t[5], t[1], t[2], t[3]) for t in tasks}
  assert got["results"] == pytest.approx(want, abs=0)
  centred = {t[0]: (want[t[0]] - t[4] / 100) / (1 - t[4] / 100) for t in tasks}
  assert got["centered_results"] == pytest.approx(centred)
  assert got["core_metric"] == pytest.approx(np.mean(list(centred.values())))
  assert 0 < want["lm_task"] < 1 and 0 < want["mc_task"] < 1, want  # not trivial
  assert math.isfinite(got["core_metric"])


def test_a_bundle_without_its_files_is_refused_in_one_line(tmp_path):
  with pytest.raises(DataError, match="core.yaml is missing"):
    core.read_bundle(str(tmp_path))
  write_bundle(tmp_path / "b", [("t", "schema", 0, " ", 50.0, [])])
  (tmp_path / "b" / "eval_meta_data.csv").write_text("Eval Task,Random baseline\n")
  with pytest.raises(DataError, match="no 'Random baseline' for CORE task 't'"):
    core.read_bundle(str(tmp_path / "b"))


def test_a_task_line_that_is_not_json_is_refused_with_its_file_and_line(tmp_path):
  item = {"context_options": ["a", "b"], "continuation": "c", "gold": 0}
  root = write_bundle(tmp_path, [("t", "schema", 0, " ", 50.0, [item])])
  with open(tmp_path / "eval_data" / "t.jsonl", "a") as f:
    f.write("\n{not json\n")
  with pytest.raises(DataError, match=r"t\.jsonl:3: not valid JSON"):
    core.read_bundle(root)


def test_an_example_longer_than_the_context_is_cropped_or_refused(tmp_path):
  """Bytes as tokens, a context of 32: a prompt that overflows keeps its last
  32 tokens and scores as nanochat scores the cropped rows; an example whose
  scored tokens need the whole context (no token before them) is refused
  with one line naming the task and the example (nanochat asserts it; a
  negative start gave a broadcast ValueError, a start of 0 scored only a tail)."""
  fits = dict(context="x" * 40, continuation="the cat")  # 1 + 40 + 8 tokens: 17 cropped
  tokens, starts, ends = core.example_spans(
    "language_modeling", core.render_lm(fits, " ", []), encode, BOS
  )
  assert (len(tokens[0]), starts, ends) == (49, [41], [49])
  assert core.unfit(tokens, starts, 32) == 0
  forward = core.forward_from_logits(bigram_logits)
  cropped = tokens[0][-32:]  # nanochat's cropped row: the continuation at 24..31
  preds = bigram_logits(np.asarray(cropped)).argmax(-1)
  want = bool(np.all(preds[23:31] == np.asarray(cropped[24:32])))
  assert (
    core.score_example("language_modeling", tokens, starts, ends, None, forward, BOS, 32) == want
  )
  # " " + continuation: 32 scored tokens leave no token of prompt before them.
  for continuation, n in (("c" * 31, 32), ("c" * 39, 40)):
    item = dict(context="the", continuation=continuation)
    spans = core.example_spans("language_modeling", core.render_lm(item, " ", []), encode, BOS)
    assert core.unfit(spans[0], spans[1], 32) == n
    with pytest.raises(DataError, match=f"scored tokens \\({n}\\) do not fit"):
      core.score_example("language_modeling", *spans, None, forward, BOS, 32)
  exact = core.example_spans("language_modeling", ["the ", "the " + "c" * 31], encode, BOS)
  assert core.unfit(exact[0], exact[1], 32) == 0  # 31 scored tokens and one before: it fits
  # Before scoring anything: the task and the example's place in the shuffle.
  long = [dict(context="the", continuation="cat"), dict(context="the", continuation="c" * 39)]
  bundle = core.read_bundle(
    write_bundle(tmp_path, [("long", "language_modeling", 0, " ", 0.0, long)])
  )
  idx = [i for i, item in enumerate(core.selected(long)) if len(item["continuation"]) == 39][0]
  calls = []
  with pytest.raises(DataError) as e:
    core.core_metric(bundle, lambda ids: calls.append(ids), encode, BOS, max_length=32)
  assert str(e.value) == (
    f"CORE task 'long', example {idx} of the shuffle: its scored tokens (40) do not fit the "
    "model's context of 32 tokens after one token of prompt (nanochat asserts this too); "
    "score a model with a longer context, or leave the task out of core.yaml"
  )
  assert calls == []
  # Multiple choice: a choice longer than the context is refused the same way.
  mc = [dict(query="Q?", choices=["a", "b" * 40], gold=0)]
  tokens, starts, _ = core.example_spans(
    "multiple_choice", core.render_mc(mc[0], " ", []), encode, BOS
  )
  assert core.unfit(tokens, starts, 32) == 40
