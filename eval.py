"""Evaluate the latest checkpoint of a laplax run.

    python eval.py --workdir runs/vit
    python eval.py --workdir runs/gpt                       # loss, perplexity, bits/byte
    python eval.py --workdir runs/gpt --sample "ROMEO." --temperature 0.8 --top_k 40
    python eval.py --workdir runs/gpt --choices questions.jsonl
    python eval.py --workdir runs/dino                      # k-NN, linear probe, PCA

Restores the newest checkpoint with the config saved in the workdir, evaluates
the eval split, prints the result and writes ``eval.json`` into the workdir:
``accuracy``, ``loss``, ``num_examples``, ``step`` for classification;
``loss``, ``perplexity``, ``bits_per_byte``, ``num_tokens``, ``step`` for
language models (plus ``choices_accuracy`` with ``--choices``);
``knn_accuracy``, ``linear_probe_accuracy``, ``raw_pixel_knn_accuracy``,
``num_examples``, ``step`` for DINO, which also writes ``patch_pca.png`` (the
first three principal components of the teacher's patch features of a few
test images, as RGB). ``--sample`` prints a continuation of the prompt
(KV-cache decoding) instead.
"""

import json
import os
import sys

from absl import flags

from laplax.train import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory written by train.py.")
_SAMPLE = flags.DEFINE_string("sample", None, "LM only: prompt to continue.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 400, "LM sampling: tokens to generate.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "LM sampling temperature (0 = greedy).")
_TOP_K = flags.DEFINE_integer("top_k", 40, "LM sampling: keep the k most likely tokens (0 = all).")
_SEED = flags.DEFINE_integer("seed", 0, "LM sampling seed.")
_CHOICES = flags.DEFINE_string("choices", None, "LM only: multiple-choice JSONL file to score.")
PCA_FIGURE = "patch_pca.png"


def main() -> int:
  cli.parse_flags(sys.argv)
  workdir = _WORKDIR.value
  if not workdir:
    raise cli.UsageError("--workdir is required, e.g. --workdir runs/vit")
  cli.quiet()
  import jax  # pylint: disable=import-outside-toplevel
  from laplax.models import sampling  # pylint: disable=import-outside-toplevel
  from laplax.train import checkpoint, lm_eval, loop, optim  # pylint: disable=import-outside-toplevel
  config = loop.load_saved_config(workdir)
  if config is None:
    raise cli.UsageError(f"{workdir} has no {loop.CONFIG_FILE}; train first with "
                         f"train.py --workdir {workdir}")
  is_lm = config.task == "lm"
  if (_SAMPLE.value is not None or _CHOICES.value) and not is_lm:
    raise cli.UsageError("--sample and --choices need a language-model workdir "
                         f"(task 'lm'); {workdir} holds task {config.task!r}")
  if _SAMPLE.value is not None:
    if _MAX_NEW.value < 1:
      raise cli.UsageError(f"--max_new_tokens={_MAX_NEW.value} must be >= 1")
    if _TEMPERATURE.value < 0:
      raise cli.UsageError(f"--temperature={_TEMPERATURE.value} must be >= 0 "
                           f"(0 = greedy)")
    if _TOP_K.value < 0:
      raise cli.UsageError(f"--top_k={_TOP_K.value} must be >= 0 (0 = all tokens)")
  items = lm_eval.read_choices(_CHOICES.value) if _CHOICES.value else None
  ckpt_dir = os.path.join(workdir, loop.CHECKPOINT_DIR)
  checkpointer = checkpoint.Checkpointer(ckpt_dir) if os.path.isdir(ckpt_dir) else None
  if checkpointer is None or checkpointer.latest_step() is None:
    raise cli.UsageError(f"{workdir} has no checkpoint; train first with train.py "
                         f"--workdir {workdir}")
  task = loop.setup(config, workdir, check=False)
  tx = optim.make_optimizer(config)
  if not os.access(workdir, os.W_OK):
    raise cli.UsageError(f"{workdir} is not writable; eval.py writes eval.json there")
  state, _ = checkpointer.restore(loop.abstract_state(task, tx, config.seed),
                                  with_data=False)
  if int(state.step) != checkpointer.latest_step():
    print(f"warning: the newest checkpoint (step {checkpointer.latest_step()}) is "
          f"unreadable; evaluating step {int(state.step)}", file=sys.stderr)

  if _SAMPLE.value is not None:
    prompt = task.tokenizer.encode(_SAMPLE.value)
    if len(prompt) >= task.model.max_length:
      raise cli.UsageError(
          f"the prompt is {len(prompt)} tokens but the context is "
          f"{task.model.max_length}; shorten it")
    if len(prompt) == 0:
      raise cli.UsageError("the prompt is empty; give some text to continue")
    out = sampling.generate(task.model, state.params, prompt,
                            max_new_tokens=_MAX_NEW.value, temperature=_TEMPERATURE.value,
                            top_k=_TOP_K.value or None,
                            rng=jax.random.PRNGKey(_SEED.value))
    print(_SAMPLE.value + task.tokenizer.decode(out))
    return 0

  if config.task == "dino":
    figure = os.path.join(workdir, PCA_FIGURE)
    summary = task.evaluate(state, references=True, figure=figure)
    if config.eval.pca_images:
      print(f"patch-feature PCA of {config.eval.pca_images} test images: {figure}")
  else:
    summary = loop.evaluate(task, state)
  if items is not None:
    result = lm_eval.score_choices(task.model, state.params, task.tokenizer, items)
    summary["choices_accuracy"] = result["choices_accuracy"]
    summary["num_questions"] = result["num_questions"]
  summary["step"] = int(state.step)
  with open(os.path.join(workdir, "eval.json"), "w") as f:
    json.dump(summary, f, indent=2)
  print(json.dumps(summary))
  return 0


if __name__ == "__main__":
  from laplax.train.lm_eval import ChoicesError  # pylint: disable=wrong-import-position
  cli.run(main, user_errors=(ChoicesError,))
