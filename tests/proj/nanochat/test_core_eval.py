"""eval.py --config.evals=core (laplax.proj.nanochat.evaluators.core.Core) on a tiny GPT
trained here, with an eval bundle the test writes in DCLM's published layout
(one task of each kind), against a NumPy transcription of nanochat's CORE
scoring that calls the model's logits directly; and the bad bundles, each one
line and exit 2 with nothing written."""

import json
import os
import random

import numpy as np
import pytest

from laplax.data.errors import DataError
from laplax.proj.nanochat.evaluators import core

from helpers.configs import load
from helpers.core_bundle import write_bundle
from helpers.lm import GPT_CONFIG, TINY, one_line_error
from helpers.runs import run_in_process

MC = [
  dict(query="the cat sat on the", choices=["mat.", "dog.", "cat.", "sat."], gold=0),
  dict(query="the cat", choices=["sat on", "ran to"], gold=0),
  dict(query="on the", choices=["cat sat", "mat."], gold=1),
  dict(query="the mat", choices=["the cat", "the end."], gold=1),  # the unlikely one
  dict(query="cat sat", choices=["on the", "in a"], gold=0),
  dict(query="the", choices=["cat", "dog", "mat"], gold=2),
]
SCHEMA = [
  dict(context_options=["the cat sat on", "a dog ran to"], continuation="the mat.", gold=0),
  dict(context_options=["the dog ate", "the cat sat"], continuation="on the mat.", gold=1),
  dict(context_options=["on the mat.", "in the box."], continuation="the cat sat", gold=1),
  dict(context_options=["sat on the", "xyz qrs"], continuation="mat.", gold=0),
]
LM = [
  dict(context="the cat sat on the ", continuation="mat."),
  dict(context="  the cat ", continuation="sat on the mat."),
  dict(context="the dog", continuation="ate a fish."),
  dict(context="on the", continuation="mat. the cat"),
  dict(context="sat", continuation="on the"),
]
TASKS = [
  ("mc", "multiple_choice", 1, " ", 25.0, MC),
  ("schema", "schema", 0, " ", 50.0, SCHEMA),
  ("lm", "language_modeling", 1, " ", 0.0, LM),
  ("lm_colon", "language_modeling", 0, ": ", 0.0, LM),
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus):
  root = tmp_path_factory.mktemp("core")
  argv = [
    "train.py",
    "--config",
    GPT_CONFIG,
    "--workdir",
    str(root / "run"),
    f"--config.data.source_dir={corpus}",
    f"--config.data.data_dir={root / 'tfds'}",
    "--config.total_steps=60",
    "--config.eval_every=20",
    "--config.checkpoint_every=60",
    "--config.eval.sample_tokens=0",
    # CORE during training (nanochat's --core-metric-every): at step 40 and
    # at the last step, not at step 20.
    "--config.evals=bits_per_byte,core",
    f"--config.eval.core_bundle={write_bundle(root / 'bundle', TASKS)}",
    "--config.eval.core_every=40",
    "--config.eval.core_max_per_task=5",
  ] + TINY
  r = run_in_process(argv)
  assert r.returncode == 0, r.stderr[-3000:]
  return root / "run"


def oracle(model, params, tokenizer, tasks, max_per_task):
  """Each task's accuracy as nanochat's core_eval.py computes it, written out
  here: its prompts, token spans, cropping and scoring on the model's float64
  logits of the unpadded rows."""
  import jax.numpy as jnp

  enc = lambda s: [int(t) for t in np.asarray(tokenizer.encode(s))]  # noqa: E731
  bos = enc("\n\n")[-1]
  width_cap = model.spec.max_length
  out = {}
  for label, kind, shots, d, _, data in tasks:
    data = list(data)
    random.Random(1337).shuffle(data)
    data = data[:max_per_task] if max_per_task else data
    right = 0
    for idx, item in enumerate(data):
      others = [i for i in range(len(data)) if i != idx]
      few = [data[i] for i in random.Random(1234 + idx).sample(others, shots)] if shots else []
      if kind == "multiple_choice":
        head = "".join(f"{s['query']}{d}{s['choices'][s['gold']]}\n\n" for s in few)
        seqs = [[bos] + enc(head + item["query"] + d + c) for c in item["choices"]]
        n = next(
          (i for i in range(min(map(len, seqs))) if len({s[i] for s in seqs}) > 1),
          min(map(len, seqs)),
        )
        spans = [(n, len(s)) for s in seqs]
      elif kind == "schema":
        head = "".join(f"{s['context_options'][s['gold']]}{d}{s['continuation']}\n\n" for s in few)
        seqs = [[bos] + enc(head + c + d + item["continuation"]) for c in item["context_options"]]
        k = 0
        while k < min(map(len, seqs)) and len({s[-1 - k] for s in seqs}) == 1:
          k += 1
        spans = [(len(s) - k, len(s)) for s in seqs]
      else:
        head = "".join(f"{s['context'].strip()}{d}{s['continuation']}\n\n" for s in few)
        prompt = head + item["context"].strip() + d
        full = [bos] + enc(prompt + item["continuation"])
        seqs, spans = [full], [(len([bos] + enc(prompt.strip())), len(full))]
      cuts = [max(0, len(s) - width_cap) for s in seqs]
      seqs = [s[c:] for s, c in zip(seqs, cuts)]
      spans = [(a - c, b - c) for (a, b), c in zip(spans, cuts)]
      ids = np.full((len(seqs), max(map(len, seqs))), bos, np.int32)
      for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
      logits = np.asarray(model.apply({"params": params}, jnp.asarray(ids))[0], np.float64)
      logp = logits - logits.max(-1, keepdims=True)
      logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
      if kind == "language_modeling":
        a, b = spans[0]
        right += all(logits[0, t - 1].argmax() == ids[0, t] for t in range(a, b))
      else:
        means = [
          -np.mean([logp[i, t - 1, ids[i, t]] for t in range(a, b)])
          for i, (a, b) in enumerate(spans)
        ]
        right += int(np.argmin(means)) == item["gold"]
    out[label] = right / len(data)
  return out


@pytest.mark.slow
def test_core_in_eval_json_equals_a_numpy_transcription(trained, tmp_path, capfd):
  bundle = write_bundle(tmp_path / "bundle", TASKS)
  out = tmp_path / "eval.json"
  r = run_in_process(
    [
      "eval.py",
      "--workdir",
      str(trained),
      "--config.evals=core,bits_per_byte",
      f"--config.eval.core_bundle={bundle}",
      "--config.eval.core_max_per_task=5",
      "--out",
      str(out),
    ],
    capfd,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads(out.read_text())
  from laplax import loading

  run = loading.load(str(trained))
  want = oracle(run.model, run.params, run.task.tokenizer, TASKS, 5)
  assert result["core_accuracy"] == want
  assert result["core_examples"] == {"mc": 5, "schema": 4, "lm": 5, "lm_colon": 5}
  centred = {t[0]: (want[t[0]] - t[4] / 100) / (1 - t[4] / 100) for t in TASKS}
  assert result["core_centered"] == pytest.approx(centred, abs=1e-12)
  assert result["core_metric"] == pytest.approx(np.mean(list(centred.values())), abs=1e-12)
  assert "bits_per_byte" in result and result["step"] == 60
  # The training loop scored the same CORE at its last step, and at step 40
  # (core_every), but not at step 20.
  records = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
  core_at = {r["step"]: r for r in records if r.get("split") == "eval" and "core_metric" in r}
  bpb_at = [r["step"] for r in records if r.get("split") == "eval" and "bits_per_byte" in r]
  assert sorted(core_at) == [40, 60] and bpb_at == [20, 40, 60], (sorted(core_at), bpb_at)
  assert core_at[60]["core_accuracy"] == want
  # Not trivial: some right and some wrong.
  assert 0 < np.mean(list(want.values())) < 1, want

  # A task without examples is found before anything is computed or written.
  empty = tmp_path / "empty"
  write_bundle(empty, TASKS[:1] + [("none", "schema", 0, " ", 50.0, [])])
  r = run_in_process(
    [
      "eval.py",
      "--workdir",
      str(trained),
      "--config.evals=core",
      f"--config.eval.core_bundle={empty}",
      "--out",
      str(tmp_path / "none.json"),
    ],
    capfd,
  )
  assert "none.jsonl holds no examples (CORE task 'none')" in one_line_error(r)
  assert not (tmp_path / "none.json").exists()

  # A continuation longer than the model's 32-token context (nanochat asserts
  # it fits): one line naming the task and the example, exit 2, nothing written
  # (a broadcast ValueError and exit 1 before).
  over = tmp_path / "over"
  long = LM + [dict(context="the cat", continuation=" ".join(["the cat sat on the mat."] * 8))]
  write_bundle(over, [("lm", "language_modeling", 0, " ", 0.0, long)])
  r = run_in_process(
    [
      "eval.py",
      "--workdir",
      str(trained),
      "--config.evals=core",
      f"--config.eval.core_bundle={over}",
      "--out",
      str(tmp_path / "over.json"),
    ],
    capfd,
  )
  assert r.returncode == 2
  line = one_line_error(r)
  assert "CORE task 'lm', example" in line and "do not fit the model's context of 32" in line
  assert not (tmp_path / "over.json").exists()


@pytest.fixture
def config_only(tmp_path):
  """A language-model workdir holding only its config.json (the bundle's
  small files are checked with the config, before any checkpoint is read)."""
  w = tmp_path / "run"
  w.mkdir()
  (w / "config.json").write_text(load("gpt_shakespeare").to_json())
  return w


def _bad(root, case):
  if case == "missing":
    return str(root / "nowhere")
  bundle = write_bundle(root / "b", TASKS[:2])
  if case == "yaml":
    (root / "b" / "core.yaml").write_text("icl_tasks: [label: x\n")
  elif case == "no_tasks":
    (root / "b" / "core.yaml").write_text("tasks: []\n")
  elif case == "csv_column":
    (root / "b" / "eval_meta_data.csv").write_text("Task,Random baseline\nmc,25\n")
  elif case == "csv_number":
    (root / "b" / "eval_meta_data.csv").write_text("Eval Task,Random baseline\nmc,x\nschema,5\n")
  elif case == "kind":
    text = (root / "b" / "core.yaml").read_text().replace("type: schema", "type: ranking")
    (root / "b" / "core.yaml").write_text(text)
  elif case == "no_data":
    os.remove(root / "b" / "eval_data" / "mc.jsonl")
  return bundle


@pytest.mark.parametrize(
  "case, message",
  [
    ("empty", "core needs the DCLM eval bundle: --config.eval.core_bundle=DIR"),
    ("missing", "nowhere is not a directory"),
    ("yaml", "core.yaml is not valid YAML"),
    ("no_tasks", "has no 'icl_tasks' list"),
    ("csv_column", "eval_meta_data.csv has no column 'Eval Task'"),
    ("csv_number", "eval_meta_data.csv:2: 'Random baseline' 'x' is not a number"),
    ("kind", "icl_task_type 'ranking' is not one of"),
    ("no_data", "mc.jsonl is missing (dataset_uri of CORE task 'mc')"),
  ],
)
def test_a_bad_bundle_is_one_line_and_exit_2(config_only, tmp_path, case, message, capfd):
  bundle = "" if case == "empty" else _bad(tmp_path, case)
  r = run_in_process(
    [
      "eval.py",
      "--workdir",
      str(config_only),
      "--config.evals=core",
      f"--config.eval.core_bundle={bundle}",
    ],
    capfd,
  )
  assert message in one_line_error(r)
  assert os.listdir(config_only) == ["config.json"]


@pytest.mark.parametrize(
  "row, message",
  [
    ({"choices": ["a"], "gold": 0}, "t.jsonl:1: a CORE multiple_choice example needs 'query'"),
    ({"query": "q", "choices": ["a", "b"], "gold": 2}, "'gold'=2 is not an index of its 2"),
    ({"query": "q", "choices": ["a", 1], "gold": 0}, "options of a CORE multiple_choice"),
    (["q"], "t.jsonl:1: a CORE multiple_choice example must be a JSON object"),
  ],
)
def test_a_malformed_example_names_its_file_and_line(tmp_path, row, message):
  write_bundle(tmp_path / "b", [("t", "multiple_choice", 0, " ", 25.0, [row])])
  with pytest.raises(DataError, match=message.replace("(", r"\(").replace("[", r"\[")):
    core.read_bundle(str(tmp_path / "b"))


def test_more_shots_than_examples_is_refused_before_scoring(tmp_path):
  write_bundle(tmp_path / "b", [("t", "language_modeling", 3, " ", 0.0, LM[:3])])
  [task] = core.read_bundle(str(tmp_path / "b"))
  with pytest.raises(DataError, match="asks for 3 few-shot examples but has 3 examples"):
    core.task_examples(task, lambda s: list(s.encode()), 0)
  task["shots"] = 2
  examples = core.task_examples(task, lambda s: list(s.encode()), 0)
  assert [len(tokens) for tokens, _, _, _ in examples] == [1, 1, 1]  # one row per LM example


def test_core_every_off_the_evaluation_steps_is_one_line_and_exit_2(tmp_path, corpus, capfd):
  r = run_in_process(
    [
      "train.py",
      "--config",
      GPT_CONFIG,
      "--workdir",
      str(tmp_path / "run"),
      f"--config.data.source_dir={corpus}",
      "--config.eval_every=20",
      "--config.evals=core",
      f"--config.eval.core_bundle={write_bundle(tmp_path / 'bundle', TASKS[:1])}",
      "--config.eval.core_every=30",
    ]
    + TINY,
    capfd,
  )
  assert "--config.eval.core_every=30 is not a multiple of eval_every=20" in one_line_error(r)
  assert not (tmp_path / "run").exists()
