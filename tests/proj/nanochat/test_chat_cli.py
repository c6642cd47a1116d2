"""eval.py --chat_tasks on a tiny GPT trained with nanochat's tokenizer, on
test splits written here in their published layouts, and the
lm-evaluation-harness adapter (laplax.cli.lm_harness) on a local task
whose accuracy must equal eval.py --choices' on the same items."""

import json
import os

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from laplax.proj.nanochat.data import sources as chat_sources  # noqa: E402
from laplax.proj.nanochat.evaluators import chat as chat_eval  # noqa: E402
from laplax.proj.nanochat.evaluators import multiple_choice  # noqa: E402

from helpers.lm import one_line_error
from helpers.runs import ROOT, run_in_process

GPT_CONFIG = os.path.join(ROOT, "configs", "gpt_shakespeare.py")
TINY = [
  "--config.model.width=32",
  "--config.model.depth=1",
  "--config.model.num_heads=2",
  "--config.model.mlp_dim=64",
  "--config.model.max_length=256",
  "--config.batch_size=4",
  "--config.eval_batch_size=4",
  "--config.total_steps=2",
  "--config.eval_every=2",
  "--config.checkpoint_every=2",
  "--config.eval.sample_tokens=0",
]


def _train(root, corpus):
  workdir = root / "run"
  argv = [
    "train.py",
    "--config",
    GPT_CONFIG,
    "--workdir",
    str(workdir),
    f"--config.data.source_dir={corpus}",
    f"--config.data.data_dir={root / 'tfds'}",
    "--config.data.tokenizer=nanochat",
    "--config.data.vocab_size=270",
  ] + TINY
  assert run_in_process(argv).returncode == 0
  return workdir


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  d = tmp_path_factory.mktemp("corpus")
  for name in "abc":
    (d / f"{name}.txt").write_text("Which is hot? The sun is hot. 2+2=4. " * 40)
  return d


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, corpus):
  return _train(tmp_path_factory.mktemp("chat"), corpus)


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory):
  """ARC (parquet and JSON lines), MMLU, GSM8K and two HumanEval problems."""
  from laplax.proj.nanochat.evaluators import humaneval

  d = tmp_path_factory.mktemp("chat_data")
  arc = d / "ai2_arc" / "ARC-Easy" / "test-00000-of-00001.parquet"
  arc.parent.mkdir(parents=True)
  pq.write_table(
    pa.table(
      {
        "question": ["Which is hot?", "2+2?", "Sky?"],
        "choices": [
          {"text": ["sun", "ice"], "label": ["A", "B"]},
          {"text": ["3", "4", "5"], "label": ["1", "2", "3"]},
          {"text": ["red", "blue", "green", "grey"], "label": list("ABCD")},
        ],
        "answerKey": ["A", "2", "B"],
      }
    ),
    arc,
  )
  challenge = d / "ai2_arc" / "ARC-Challenge" / "test.jsonl"
  challenge.parent.mkdir()
  challenge.write_text(
    json.dumps(
      {
        "question": "Cold?",
        "answerKey": "B",
        "choices": {"text": ["sun", "ice"], "label": ["A", "B"]},
      }
    )
    + "\n"
  )
  mmlu = d / "mmlu" / "all" / "test-00000-of-00001.parquet"
  mmlu.parent.mkdir(parents=True)
  pq.write_table(
    pa.table(
      {
        "question": ["1+1?", "3*3?"],
        "subject": ["m", "m"],
        "choices": [["1", "2", "3", "4"], ["6", "9", "3", "1"]],
        "answer": [1, 1],
      }
    ),
    mmlu,
  )
  gsm = d / "gsm8k" / "main" / "test.jsonl"
  gsm.parent.mkdir(parents=True)
  gsm.write_text(
    "".join(
      json.dumps({"question": q, "answer": a}) + "\n"
      for q, a in [("2 and 3?", "<<2+3=5>>5\n#### 5"), ("Half of 8?", "#### 4")]
    )
  )
  (d / "words_alpha.txt").write_text("cat\ndog\nstrawberry\n")  # SpellingBee's word list
  he = d / "openai_humaneval" / "test.jsonl"
  he.parent.mkdir()
  he.write_text("".join(json.dumps(p) + "\n" for p in humaneval.load_problems()[:2]))
  return d


@pytest.mark.slow
def test_chat_tasks_write_every_score_and_chatcore(workdir, chat_data, capfd):
  r = run_in_process(
    [
      "eval.py",
      "--workdir",
      str(workdir),
      "--chat_tasks",
      "all",
      "--chat_data",
      str(chat_data),
      "--chat_max_new_tokens",
      "3",
      "--chat_batch_size",
      "2",
      "--config.eval.spellingbee_size=4",
    ],
    capfd,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  result = json.loads((workdir / "eval.json").read_text())
  assert result["num_problems"] == {
    "arc_easy": 3,
    "arc_challenge": 1,
    "mmlu": 2,
    "gsm8k": 2,
    "humaneval": 2,
    "spellingbee": 4,
  }
  assert result["chatcore_tasks"] == list(chat_eval.TASKS) and result["step"] == 2
  scores = {t: result[t] for t in chat_eval.TASKS}
  assert result["chatcore"] == pytest.approx(chat_eval.chatcore(scores))
  # 3 new tokens cannot hold "#### n" nor a passing program.
  assert scores["gsm8k"] == scores["humaneval"] == scores["spellingbee"] == 0.0
  # ARC-Easy: the letters scored on the restored model, as the evaluator does.
  from laplax import loading as restore

  run = restore.load(str(workdir))
  conversations = chat_sources.shuffled(chat_sources.arc(str(chat_data / "ai2_arc" / "ARC-Easy")))
  direct = multiple_choice.evaluate(
    run.task.model, run.state.params, run.task.tokenizer, conversations, progress=False
  )
  assert scores["arc_easy"] == direct["accuracy"]
  # --chat_max_problems takes the first problems of the seed-42 shuffle.
  r = run_in_process(
    [
      "eval.py",
      "--workdir",
      str(workdir),
      "--chat_tasks",
      "arc_easy",
      "--chat_data",
      str(chat_data),
      "--chat_max_problems",
      "1",
      "--out",
      str(workdir / "one.json"),
    ],
    capfd,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  one = json.loads((workdir / "one.json").read_text())
  first = direct["predictions"][0] == conversations[0]["messages"][-1]["content"]
  assert one["arc_easy"] == float(first) and one["num_problems"] == {"arc_easy": 1}


@pytest.mark.parametrize(
  "args, message",
  [
    (["--chat_data", "x"], "--chat_data needs --chat_tasks"),
    (["--chat_tasks", "arc_easy,nope"], "give distinct names"),
    (["--chat_tasks", "mmlu"], "needs --chat_data DIR"),
    (["--chat_tasks", "spellingbee"], "spellingbee needs its word list"),
    (
      ["--chat_tasks", "spellingbee", "--config.eval.spellingbee_words={data}/no.txt"],
      "no.txt is not a file",
    ),
    (["--chat_tasks", "gsm8k", "--chat_data", "{data}/ai2_arc"], "No test split of main"),
    (["--chat_tasks", "mmlu", "--chat_batch_size", "0"], "--chat_batch_size=0 must be >= 1"),
    (["--chat_tasks", "mmlu", "--sample", "x"], "cannot be combined"),
  ],
)
def test_bad_chat_flags_are_one_line_errors(workdir, chat_data, args, message, capfd):
  before = sorted(os.listdir(workdir))
  args = [a.replace("{data}", str(chat_data)) for a in args]
  r = run_in_process(["eval.py", "--workdir", str(workdir)] + args, capfd)
  assert message in one_line_error(r)
  assert sorted(os.listdir(workdir)) == before


def test_a_tokenizer_without_chat_tokens_is_exit_2(workdir, tmp_path, chat_data, capfd):
  """A run trained with another tokenizer (its saved config says so) is
  refused before anything is loaded or written."""
  config = json.loads((workdir / "config.json").read_text())
  config["data"]["tokenizer"] = "byte"
  other = tmp_path / "byte_run"
  other.mkdir()
  (other / "config.json").write_text(json.dumps(config))
  r = run_in_process(
    ["eval.py", "--workdir", str(other), "--chat_tasks", "arc_easy", "--chat_data", str(chat_data)],
    capfd,
  )
  assert "no chat special tokens" in one_line_error(r)
  assert os.listdir(other) == ["config.json"]


# --------------------------------------------------------------------------
# lm-evaluation-harness.

TASK_YAML = """task: laplax_fixture_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: question
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
"""


class _Request:
  def __init__(self, *args):
    self.args = args


@pytest.mark.slow
def test_harness_accuracy_equals_laplax_choices(workdir, tmp_path, monkeypatch):
  pytest.importorskip("lm_eval")
  import lm_eval.evaluator  # noqa: F401
  from lm_eval.api.registry import get_model
  from lm_eval.tasks import TaskManager

  from laplax.cli import lm_harness
  from laplax.evaluators import lm_samples as laplax_choices
  from laplax.models import sampling

  assert get_model("laplax") is lm_harness.LaplaxLM  # what --model laplax finds
  items = [
    {"question": "Which is hot? The", "choices": ["sun", "ice", "snow"], "answer": a}
    for a in (0, 1)
  ] + [
    {"question": "2+2=", "choices": ["4", "5"], "answer": 0},
    {"question": "The sun is", "choices": ["hot.", "cold."], "answer": 1},
  ]
  data = tmp_path / "items.jsonl"
  data.write_text("".join(json.dumps(i) + "\n" for i in items))
  (tmp_path / "tasks").mkdir()
  (tmp_path / "tasks" / "fixture.yaml").write_text(TASK_YAML.format(data=data))
  monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # the json builder is local
  lm = lm_harness.LaplaxLM.create_from_arg_string(f"workdir={workdir},batch_size=3")
  # The harness's evaluate() (simple_evaluate adds seeds and an environment
  # report, which import PyTorch: seconds that test nothing of laplax).
  manager = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False)
  out = lm_eval.evaluator.evaluate(
    lm=lm, task_dict=manager.load(["laplax_fixture_mc"]), bootstrap_iters=0
  )
  acc = out["results"]["laplax_fixture_mc"]["acc,none"]
  # eval.py --choices' scorer on the same items and model.
  own = laplax_choices.score_choices(
    lm.model, lm.params, lm.tokenizer, laplax_choices.read_choices(str(data))
  )
  assert acc == own["choices_accuracy"]
  assert [round(x["acc"]) for x in out["samples"]["laplax_fixture_mc"]] == [
    int(p == i["answer"]) for p, i in zip(own["predictions"], items)
  ]

  # The other two request types, against laplax's unbatched functions.
  tok = lm.tokenizer
  text = "The sun is hot."
  [rolling] = lm.loglikelihood_rolling([_Request(text)], disable_tqdm=True)
  assert rolling == pytest.approx(
    sampling.continuation_logprob(lm.model, lm.params, [tok.bos_id], tok.encode(text)), rel=1e-5
  )
  contexts = ["Which is", "2+2"]
  got = lm.generate_until(
    [_Request(c, {"until": ["."], "max_gen_toks": 12}) for c in contexts], disable_tqdm=True
  )
  for context, text in zip(contexts, got):
    tokens = sampling.generate(
      lm.model, lm.params, tok.encode(context), max_new_tokens=12, temperature=0.0
    )
    bos = list(tokens).index(tok.bos_id) if tok.bos_id in tokens else len(tokens)
    assert text == tok.decode(np.asarray(tokens[:bos])).split(".")[0]
