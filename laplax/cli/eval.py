"""Evaluate a checkpoint of a laplax run (``laplax-eval``, or ``python eval.py``);
the user guide is ``docs/evaluation.md``.

Usage: ``laplax-eval --workdir DIR [--step N] [--out FILE] [--config.evals=NAMES]
[--config.eval.KEY=VALUE ...] [--sample PROMPT] [--analysis]``.

Contract: restores the checkpoint of ``--step`` (default: the newest
readable one) with the workdir's saved config (:func:`laplax.loading.load`,
onto one device), runs the evaluators of ``config.evals`` whose stages hold
``"eval"`` (:func:`laplax.evaluators.registry.build`; ``--choices`` adds
``multiple_choice``) and writes their merged numbers, the ``step`` and the
``attention_kernel`` to ``WORKDIR/eval.json`` (or ``--out FILE``, the
figures beside it; the workdir is then only read). ``--config.eval.KEY=VALUE``
and ``--config.evals=NAMES`` change the saved config for this evaluation only
(:func:`apply_overrides`); ``--chat_tasks`` and its ``--chat_*`` options are
aliases of ``--config.evals=`` the chat benchmarks and
``--config.eval.chat_*`` (:func:`_chat_overrides`). ``--sample`` prints a
continuation instead; ``--analysis`` writes ``analysis.json`` and its plots
instead (:mod:`laplax.analysis.report`).

Bad input prints one line and exits with code 2, with nothing written.
SIGINT or SIGTERM ends it within 5 s, with one line and exit code 130 or 143
(:mod:`laplax.signals`); the results are written only at the end.
"""

import json
import os
import re
import sys
import tempfile

from absl import flags

from laplax import signals
from laplax.cli import common as cli
from laplax.workdir import saving

# The evaluator's own flags (not absl's global FLAGS, where train_cli defines
# its --workdir and --config): the two commands' mains can then run in one
# process (the tests run many eval.py commands in-process).
FLAGS = flags.FlagValues()
_WORKDIR = flags.DEFINE_string(
  "workdir", None, "Run directory written by train.py.", flag_values=FLAGS
)
_STEP = flags.DEFINE_integer(
  "step",
  None,
  "Evaluate the checkpoint of this step (default: the newest readable one).",
  flag_values=FLAGS,
)
_OUT = flags.DEFINE_string(
  "out",
  None,
  "Write the results to this file instead of WORKDIR/eval.json "
  "(WORKDIR/analysis.json with --analysis), the pictures into its directory; "
  "the workdir is only read.",
  flag_values=FLAGS,
)
_SAMPLE = flags.DEFINE_string("sample", None, "LM only: prompt to continue.", flag_values=FLAGS)
_MAX_NEW = flags.DEFINE_integer(
  "max_new_tokens", 400, "LM sampling: tokens to generate.", flag_values=FLAGS
)
_TEMPERATURE = flags.DEFINE_float(
  "temperature", 0.8, "LM sampling temperature (0 = greedy).", flag_values=FLAGS
)
_TOP_K = flags.DEFINE_integer(
  "top_k", 40, "LM sampling: keep the k most likely tokens (0 = all).", flag_values=FLAGS
)
_SEED = flags.DEFINE_integer("seed", 0, "LM sampling seed.", flag_values=FLAGS)
_CHOICES = flags.DEFINE_string(
  "choices", None, "LM only: multiple-choice JSONL file to score.", flag_values=FLAGS
)
_ANALYSIS = flags.DEFINE_bool(
  "analysis",
  False,
  "Write analysis.json and analysis_*.png (token geometry, conditioning) instead of evaluating.",
  flag_values=FLAGS,
)
_ANALYSIS_LAYERS = flags.DEFINE_string(
  "analysis_layers",
  None,
  "--analysis: comma-separated block indices, e.g. 0,3 (default: every layer).",
  flag_values=FLAGS,
)
_ANALYSIS_EXAMPLES = flags.DEFINE_integer(
  "analysis_examples",
  0,
  "--analysis: at most this many eval sequences (0 = all).",
  flag_values=FLAGS,
)
_ANALYSIS_CLASSES = flags.DEFINE_enum(
  "analysis_classes",
  "auto",
  ["auto", "yes", "no"],
  "--analysis: class statistics from the eval labels (auto: when the task has "
  "them; language models use next-token classes).",
  flag_values=FLAGS,
)
_ANALYSIS_JACOBIAN = flags.DEFINE_integer(
  "analysis_jacobian_dim",
  2048,
  "--analysis: the attention Jacobian is taken on "
  "the first DIM // width tokens of one example (0 = skip).",
  flag_values=FLAGS,
)
_ANALYSIS_BATCH = flags.DEFINE_integer(
  "analysis_batch_size", 256, "--analysis: sequences per forward pass.", flag_values=FLAGS
)
_CHAT_TASKS = flags.DEFINE_string(
  "chat_tasks",
  None,
  "LM with nanochat's tokenizer: nanochat's chat evaluations, "
  "comma-separated among arc_easy, arc_challenge, mmlu, gsm8k, humaneval, spellingbee "
  "(or all); eval.json then holds their scores and ChatCORE (an alias of "
  "--config.evals=NAMES; the --chat_* options of --config.eval.chat_*). spellingbee "
  "reads its word list from --chat_data's words_alpha.txt or "
  "--config.eval.spellingbee_words=FILE.",
  flag_values=FLAGS,
)
_CHAT_DATA = flags.DEFINE_string(
  "chat_data",
  None,
  "--chat_tasks: directory of the test splits in the Hugging Face "
  "layout (e.g. DIR/ai2_arc/ARC-Easy/test-00000-of-00001.parquet).",
  flag_values=FLAGS,
)
_CHAT_MAX = flags.DEFINE_integer(
  "chat_max_problems",
  0,
  "--chat_tasks: at most this many problems per task (0 = all).",
  flag_values=FLAGS,
)
_CHAT_BATCH = flags.DEFINE_integer(
  "chat_batch_size", 8, "--chat_tasks: prompts per batch.", flag_values=FLAGS
)
_CHAT_NEW = flags.DEFINE_integer(
  "chat_max_new_tokens",
  512,
  "--chat_tasks: tokens generated per GSM8K / HumanEval / SpellingBee answer.",
  flag_values=FLAGS,
)
_UNSAFE = flags.DEFINE_bool(
  "unsafe_no_sandbox",
  False,
  "--chat_tasks humaneval: run the generated programs "
  "WITHOUT the bubblewrap sandbox (only where it cannot be had); eval.json records "
  "it.",
  flag_values=FLAGS,
)
CHAT_OPTIONS = (
  "chat_data",
  "chat_max_problems",
  "chat_batch_size",
  "chat_max_new_tokens",
  "unsafe_no_sandbox",
)
ANALYSIS_OPTIONS = (
  "analysis_layers",
  "analysis_examples",
  "analysis_classes",
  "analysis_jacobian_dim",
  "analysis_batch_size",
)
EVAL_FILE = "eval.json"


def _out_path(workdir: str) -> str | None:
  """``--out`` as an absolute path (``None`` without), checked before anything is evaluated.

  Raises:
    cli.UsageError: ``--out`` a directory, under a file or unwritable; without it, an
      unwritable workdir (unless ``--sample`` only prints).
  """
  from laplax import store
  from laplax.workdir.files import existing_ancestor

  store.check_scheme(workdir)
  if _OUT.value is None:
    if store.is_remote(workdir):
      return None
    if _SAMPLE.value is None and not os.access(workdir, os.W_OK):
      raise cli.UsageError(
        f"{workdir} is not writable; eval.py writes eval.json there; "
        f"give --out FILE to write the results elsewhere"
      )
    return None
  if not _OUT.value.strip():
    raise cli.UsageError("--out is empty; give a file name, e.g. --out evals/eval.json")
  path = os.path.abspath(os.path.expanduser(_OUT.value))
  if os.path.isdir(path) or _OUT.value.endswith(os.sep):
    raise cli.UsageError(
      f"--out={_OUT.value} is a directory; give a file name, e.g. "
      f"--out {os.path.join(_OUT.value, 'eval.json')}"
    )
  parent = existing_ancestor(os.path.dirname(path))
  if not os.path.isdir(parent):
    raise cli.UsageError(f"--out={_OUT.value}: {parent} is a file, not a directory")
  if not os.access(parent, os.W_OK):
    raise cli.UsageError(f"--out={_OUT.value}: {parent} is not writable")
  try:  # os.access passes for root; a file system may still refuse
    with tempfile.TemporaryFile(dir=parent):
      pass
  except OSError as e:
    raise cli.UsageError(
      f"--out={_OUT.value}: cannot write in {parent} ({e.strerror}); give --out a writable place"
    ) from None
  return path


_EVAL_OVERRIDE = re.compile(r"--config\.(eval\.\w+|evals)=(.*)", re.S)


def split_overrides(argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
  """``argv`` without its ``--config.eval.KEY=VALUE`` / ``--config.evals=NAMES``, and those
  as ordered ``(KEY, VALUE)`` pairs (``"eval.NAME"`` or ``"evals"``).

  Raises:
    cli.UsageError: a ``--config...`` argument of another form or section.
  """
  rest, overrides = [], []
  for arg in argv:
    if not arg.startswith("--config"):
      rest.append(arg)
      continue
    m = _EVAL_OVERRIDE.fullmatch(arg)
    if not m:
      raise cli.UsageError(
        f"{arg}: eval.py evaluates the saved config and takes overrides of its eval "
        f"section and evaluators only, as --config.eval.KEY=VALUE (e.g. "
        f"--config.eval.segmentation_dataset=ade20k) or --config.evals=NAMES"
      )
    overrides.append((m.group(1), m.group(2)))
  return rest, overrides


def _typed(key: str, raw: str, like):
  """``raw`` as the type of ``like`` (bool, int, float or str), or UsageError."""
  if isinstance(like, bool):
    if raw.lower() in ("true", "1", "yes", "false", "0", "no"):
      return raw.lower() in ("true", "1", "yes")
  else:
    try:
      return type(like)(raw) if isinstance(like, (int, float)) else raw
    except ValueError:
      pass
  raise cli.UsageError(f"--config.{key}={raw}: not a {type(like).__name__}")


def apply_overrides(config, overrides: list[tuple[str, str]]):
  """Sets the ``(KEY, VALUE)`` overrides of a saved, complete config and
  validates it; returns its run spec (:func:`laplax.tasks.validate`), which
  :func:`laplax.loading.load` then takes as checked, or ``None`` without
  overrides (``load`` checks the saved config).

  Raises:
    cli.UsageError: an unknown key or a value of the wrong type.
    ConfigError: a value the config's checks refuse.
  """
  from laplax import tasks
  from laplax.evaluators import registry

  if not overrides:
    return None
  registry.complete(config)  # the settings of the task's evaluators, at their defaults
  known = dict(config.eval) if "eval" in config else {}  # a classifier has none
  for dotted, raw in overrides:
    if dotted == "evals":
      with config.unlocked():
        config.evals = raw
      continue
    key = dotted[len("eval.") :]
    if key not in known:
      choices = (
        f"keys of config.eval: {', '.join(sorted(known))}"
        if known
        else f"this {config.task!r} run has no eval settings (the segmentation keys are DINO's)"
      )
      raise cli.UsageError(
        f"unknown config key 'eval.{key}' in --config.eval.{key}={raw}; {choices}"
      )
    with config.unlocked():
      config.eval[key] = _typed(dotted, raw, known[key])
  run = tasks.validate(config, None, strict_keys=False)
  registry.validate(config)
  return run


def _check_flags() -> None:
  """The checks of the flags alone, before anything is read.

  Raises:
    cli.UsageError: the first bad flag or combination.
  """
  if not _ANALYSIS.value:
    given = [name for name in ANALYSIS_OPTIONS if FLAGS[name].present]
    if given:
      raise cli.UsageError(f"--{given[0]} needs --analysis")
  _check_chat_flags()
  if not _WORKDIR.value:
    raise cli.UsageError("--workdir is required, e.g. --workdir runs/vit")
  if _STEP.value is not None and _STEP.value < 0:
    raise cli.UsageError(f"--step={_STEP.value} must be >= 0 (a saved step; default: the newest)")
  if _OUT.value is not None and _SAMPLE.value is not None:
    raise cli.UsageError(
      "--out takes the results of an evaluation; --sample only "
      "prints its text (redirect it instead)"
    )
  if _SAMPLE.value is not None:
    if _MAX_NEW.value < 1:
      raise cli.UsageError(f"--max_new_tokens={_MAX_NEW.value} must be >= 1")
    if _TEMPERATURE.value < 0:
      raise cli.UsageError(f"--temperature={_TEMPERATURE.value} must be >= 0 (0 = greedy)")
    if _TOP_K.value < 0:
      raise cli.UsageError(f"--top_k={_TOP_K.value} must be >= 0 (0 = all tokens)")


def main(guard: signals.Guard) -> int:
  """Parses ``sys.argv``, evaluates (or samples, or analyses) and writes the results; returns 0.

  Raises:
    cli.UsageError, LoadError, ChoicesError, ConfigError, DataError: the user errors
      :func:`run_cli` prints as one line.
  """
  argv, overrides = split_overrides(sys.argv)
  cli.parse_flags(argv, FLAGS, help_module=sys.modules[__name__])
  _check_flags()
  workdir = _WORKDIR.value
  guard.nothing_saved = "nothing was written (eval.py writes its results when it ends)"
  cli.quiet()
  from laplax import loading as restore
  from laplax import tasks
  from laplax.evaluators import lm_samples as lm_eval

  config = restore.saved_config(workdir)
  overrides += _chat_overrides(config, workdir)
  checked = apply_overrides(config, overrides)  # the run spec, built once
  if (_SAMPLE.value is not None or _CHOICES.value) and not tasks.is_language_model(config):
    raise cli.UsageError(
      "--sample and --choices need a language-model workdir "
      f"(task 'lm'); {workdir} holds task {config.task!r}"
    )
  analysis = _analysis_options(config) if _ANALYSIS.value else None
  items = lm_eval.read_choices(_CHOICES.value) if _CHOICES.value else None
  steps = restore.saved_steps(workdir)
  if not steps:
    raise restore.LoadError(
      f"{workdir} has no checkpoint; train first with train.py --workdir {workdir}"
    )
  if _STEP.value is not None and _STEP.value not in steps:
    raise restore.LoadError(
      f"--step {_STEP.value} is not saved in {workdir}; saved steps: {', '.join(map(str, steps))}"
    )
  out = _out_path(workdir)
  run = restore.load(workdir, step=_STEP.value, run=checked)
  config, task, state = run.config, run.task, run.eval_state
  if _STEP.value is None and run.step < run.latest_step:
    print(
      f"warning: the newest checkpoint (step {run.latest_step}) is "
      f"unreadable; evaluating step {run.step}",
      file=sys.stderr,
    )
  if _SAMPLE.value is not None:
    return _sample(task, state)
  if out:
    os.makedirs(os.path.dirname(out), exist_ok=True)
  from laplax import store

  remote = store.is_remote(workdir) and out is None
  if analysis is not None:
    if remote:
      raise cli.UsageError(
        f"--analysis writes its figures beside analysis.json, which {workdir} (an object "
        f"store) cannot hold yet; give --out FILE, a local path"
      )
    return _run_analysis(run.run_spec, task, state, workdir, analysis, out)

  # gs://: the figures are drawn locally, then uploaded into the workdir.
  where = tempfile.mkdtemp(prefix="laplax-figures-") if remote else None
  summary, figures = _evaluate(
    task,
    state,
    run.run_spec.evaluation.evals,
    where or (os.path.dirname(out) if out else workdir),
    items,
  )
  if figures and out is None:  # with --out the workdir is only read
    from laplax.workdir import files as workdir_lib

    workdir_lib.log_figures(workdir, run.run_spec, int(state.step), figures)
    for figure in figures if remote else ():
      store.upload(figure, store.join(workdir, os.path.basename(figure)))
  if where is not None:
    import shutil

    shutil.rmtree(where, ignore_errors=True)
  summary["step"] = int(state.step)
  from laplax.config import validation as config_lib

  summary["attention_kernel"] = config_lib.attention_kernel(config, task)
  path = out or os.path.join(workdir, EVAL_FILE)
  with saving.guard(os.path.basename(path), os.path.dirname(path)):
    store.write(path, json.dumps(summary, indent=2))
  if out:
    print(f"wrote {path}")
  print(json.dumps(summary))
  return 0


def _evaluate(
  task, state, evals: tuple[str, ...], out_dir: str, items: list[dict] | None
) -> tuple[dict, list[str]]:
  """``(summary, figures)`` of the ``eval.py`` evaluators of ``evals`` (the
  run spec's ``config.evals``), then ``--choices``.

  Every evaluator's data is read before any computes.

  Raises:
    DataError, ConfigError: an evaluator's data cannot be used.
  """
  from laplax import sharding
  from laplax.evaluators import registry

  choices = registry.get("multiple_choice")(task, items) if items is not None else None
  evaluators = registry.build(task, registry.EVAL, evals, multiple_choice=choices)
  ctx = registry.Context(out_dir=out_dir, mesh=sharding.make_mesh())
  summary, _ = registry.run(evaluators, state, ctx)
  return summary, ctx.figures


def _sample(task, state) -> int:
  """``--sample``: prints the prompt and its continuation (KV-cache decoding).

  Raises:
    cli.UsageError: an empty prompt, or one that fills the context.
  """
  import jax

  from laplax.models import sampling

  prompt = task.tokenizer.encode(_SAMPLE.value)
  if len(prompt) >= task.model.spec.max_length:
    raise cli.UsageError(
      f"the prompt is {len(prompt)} tokens but the context is "
      f"{task.model.spec.max_length}; shorten it"
    )
  if len(prompt) == 0:
    raise cli.UsageError("the prompt is empty; give some text to continue")
  tokens = sampling.generate(
    task.model,
    state.params,
    prompt,
    max_new_tokens=_MAX_NEW.value,
    temperature=_TEMPERATURE.value,
    top_k=_TOP_K.value or None,
    rng=jax.random.PRNGKey(_SEED.value),
  )
  print(_SAMPLE.value + task.tokenizer.decode(tokens))
  return 0


def _check_chat_flags() -> None:
  """The chat flags alone: options without ``--chat_tasks``, combinations
  with other modes, bad numbers.

  Raises:
    cli.UsageError: the first bad flag.
  """
  if not _CHAT_TASKS.value:
    given = [name for name in CHAT_OPTIONS if FLAGS[name].present]
    if given:
      raise cli.UsageError(f"--{given[0]} needs --chat_tasks")
    return
  if _SAMPLE.value is not None or _CHOICES.value or _ANALYSIS.value:
    raise cli.UsageError(
      "--chat_tasks cannot be combined with --sample, --choices or --analysis; run them separately"
    )
  for name, flag, low in (
    ("chat_max_problems", _CHAT_MAX, 0),
    ("chat_batch_size", _CHAT_BATCH, 1),
    ("chat_max_new_tokens", _CHAT_NEW, 1),
  ):
    if flag.value < low:
      raise cli.UsageError(f"--{name}={flag.value} must be >= {low}")


def _chat_overrides(config, workdir: str) -> list[tuple[str, str]]:
  """``--chat_tasks`` and its options as the ``evals`` / ``eval.chat_*`` overrides they alias.

  Raises:
    cli.UsageError: not a language-model workdir.
    DataError: an unknown or repeated task name.
  """
  if not _CHAT_TASKS.value:
    return []
  from laplax import tasks
  from laplax.proj.nanochat.evaluators import chat

  if not tasks.is_language_model(config):
    raise cli.UsageError(
      f"--chat_tasks needs a language-model workdir (task 'lm'); "
      f"{workdir} holds task {config.task!r}"
    )
  out = [("evals", ",".join(chat.parse_tasks(_CHAT_TASKS.value)))]
  if _CHAT_DATA.value is not None:
    out.append(("eval.chat_data", _CHAT_DATA.value))
  if _UNSAFE.value:  # HumanEval's eval.unsafe_no_sandbox (its validate fails closed)
    print(
      "warning: --unsafe_no_sandbox: HumanEval's generated programs run without isolation",
      file=sys.stderr,
    )
    out.append(("eval.unsafe_no_sandbox", "True"))
  return out + [
    ("eval.chat_max_problems", str(_CHAT_MAX.value)),
    ("eval.chat_batch_size", str(_CHAT_BATCH.value)),
    ("eval.chat_max_new_tokens", str(_CHAT_NEW.value)),
  ]


def _analysis_options(config) -> dict:
  """The checked ``--analysis_*`` options, before any data is read.

  Raises:
    cli.UsageError: a missing layer, class statistics without labels, bad numbers,
      or ``--analysis`` with ``--sample`` / ``--choices``.
  """
  from laplax.analysis import report

  if _SAMPLE.value is not None or _CHOICES.value:
    raise cli.UsageError(
      "--analysis cannot be combined with --sample or --choices; run them separately"
    )
  try:
    layers = report.parse_layers(_ANALYSIS_LAYERS.value, int(config.model.depth))
  except ValueError as e:
    raise cli.UsageError(f"--analysis_layers={_ANALYSIS_LAYERS.value}: {e}") from None
  for name, value, low in (
    ("analysis_examples", _ANALYSIS_EXAMPLES.value, 0),
    ("analysis_jacobian_dim", _ANALYSIS_JACOBIAN.value, 0),
    ("analysis_batch_size", _ANALYSIS_BATCH.value, 1),
  ):
    if value < low:
      raise cli.UsageError(f"--{name}={value} must be >= {low}")
  from laplax import tasks

  if _ANALYSIS_CLASSES.value == "yes" and tasks.is_language_model(config):
    raise cli.UsageError(
      "--analysis_classes=yes needs per-sequence labels, which a language model's "
      "eval windows do not have (its CDNV uses next-token classes by default)"
    )
  return {
    "layers": layers,
    "classes": _ANALYSIS_CLASSES.value != "no",
    "max_examples": _ANALYSIS_EXAMPLES.value,
    "jacobian_dim": _ANALYSIS_JACOBIAN.value,
    "batch_size": _ANALYSIS_BATCH.value,
  }


def _training_loss(task, state):
  """``loss_fn(params, batch)``: the task's training loss at ``state``, key ``PRNGKey(0)`` (reproducible)."""
  import jax

  rng = jax.random.PRNGKey(0)

  def loss_fn(params, batch):
    return task.loss(params, batch, rng, state.task_state, state.step)[0]

  return loss_fn


def _run_analysis(run_spec, task, state, workdir: str, opts: dict, out: str | None) -> int:
  """``--analysis``: streams the eval split, writes analysis.json (or ``out``)
  and the plots (into the workdir or ``out``'s directory); ``run_spec``: the
  checked run (its ``config``; W&B from its observability section)."""
  from laplax import spectral as spectral_lib
  from laplax.analysis import plots, report, summary

  config = run_spec.config
  sp = config.model.spectral
  spectral = {
    "enabled": bool(sp.enabled),
    "lam": float(sp.lam),
    "mode": sp.mode,
    "targets": spectral_lib.check_targets(sp.targets),
  }
  model, params = task.backbone(state)
  readout = task.readout(state)
  from laplax import tasks

  if task.analysis_loss_unavailable:
    grad = {"no_loss_reason": task.analysis_loss_unavailable}
  else:  # the backbone's params are the trained ones
    grad = {"loss_fn": _training_loss(task, state)}
  if tasks.is_language_model(config):
    vocab_size = task.tokenizer.vocab_size if opts["classes"] else 0
    target = report.Target(
      model,
      params,
      "lm",
      vocab_size=vocab_size,
      token_classifier=readout,
      spectral=spectral,
      **grad,
    )
  else:
    num_classes = int(task.num_classes)
    if _ANALYSIS_CLASSES.value == "yes" and num_classes < 2:
      raise cli.UsageError(
        f"--analysis_classes=yes needs labels, but the eval split of "
        f"{config.data.name} has {num_classes} classes"
      )
    num_classes = num_classes if opts["classes"] and num_classes >= 2 else 0
    target = report.Target(
      model,
      params,
      "image",
      num_classes=num_classes,
      classifier=readout if num_classes else None,
      spectral=spectral,
      **grad,
    )
  batches = task.eval_batches()
  analysis = report.run_analysis(  # an AnalysisError is a UserError: one line, exit 2
    target,
    batches,
    layers=opts["layers"],
    max_examples=opts["max_examples"],
    batch_size=opts["batch_size"],
    jacobian_dim=opts["jacobian_dim"],
  )
  analysis["task"] = config.task
  analysis["step"] = int(state.step)
  where = os.path.dirname(out) if out else workdir
  with saving.guard(f"{os.path.basename(out or report.ANALYSIS_FILE)} and its figures", where):
    path = report.write(analysis, workdir, path=out)
    figures = plots.save_all(
      analysis,
      os.path.dirname(path),
      title=f"{os.path.basename(os.path.normpath(workdir))} (step {int(state.step)})",
    )
  if out is None:  # with --out the workdir is only read
    from laplax.workdir import files as workdir_lib

    workdir_lib.log_figures(workdir, run_spec, int(state.step), figures)
  rows = summary.summary(analysis)
  keys = [k for k, _, _ in summary.QUANTITIES if any(v is not None for v in rows[k])]
  print(
    f"analysis of {analysis['num_sequences']} sequences, "
    f"{analysis['num_tokens']} tokens (step {analysis['step']})"
  )
  for j, layer in enumerate(rows["layer"]):
    values = ", ".join(
      f"{k}={rows[k][j]:.4g}" if isinstance(rows[k][j], float) else f"{k}={rows[k][j]}"
      for k in keys
    )
    print(f"layer {layer}: {values}")
  print(
    f"wrote {path} and {', '.join(os.path.basename(f) for f in figures)}"
    + (f" in {os.path.dirname(path)}" if out else "")
  )
  return 0


def run_cli() -> None:
  """The ``laplax-eval`` command (``python eval.py``): :func:`main` with its
  user errors as one stderr line and exit code 2."""
  cli.run(main)


if __name__ == "__main__":
  run_cli()
