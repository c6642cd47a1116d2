"""laplax GPTs in EleutherAI's lm-evaluation-harness (``lm-eval`` on PyPI).

    python -m laplax.cli.lm_harness --model laplax \\
        --model_args workdir=runs/gpt --tasks arc_easy,hellaswag --batch_size 16

runs the harness's own command line (``lm_eval``, every flag of it) with the
model class :class:`LaplaxLM` registered as ``laplax``. ``lm_eval`` itself
finds only the models it knows or that are registered in its process (it has
no plug-in discovery), hence this entry point; from Python,
``import laplax.cli.lm_harness`` registers the class and
``lm_eval.simple_evaluate(model="laplax", model_args="workdir=W", ...)`` or
``simple_evaluate(model=LaplaxLM(workdir=W), ...)`` run it. The harness
reads local data sets too (a task YAML with ``dataset_path: json`` and
``dataset_kwargs: {data_files: ...}``; ``--include_path DIR``).

Model arguments (``--model_args``): ``workdir`` (required), ``step`` (a
saved step; default the newest), ``max_gen_toks`` (default of
``generate_until``, 256), ``prefix_bos`` (``true``: every context starts with
``<|bos|>``; the default, ``false``, scores a context as laplax's own
``eval.py --choices`` does). The rows per forward pass are the harness's
``--batch_size`` (``auto``: 8), which it passes itself (so not in
``--model_args`` on its command line).

How each request type is computed:

* ``loglikelihood``: ``(sum log p(continuation | context), is_greedy)`` with
  the context and the continuation encoded apart and joined
  (:func:`laplax.models.sampling.continuation_logprobs`, batched; the oldest
  context tokens dropped beyond the model's context). An empty context is
  the start token: ``<|bos|>`` (nanochat's tokenizer) or the last token of
  ``"\\n\\n"``, the document separator of laplax's text corpora. So a
  multiple-choice task's ``acc`` (context = the question, continuation =
  ``" " + choice``) equals ``eval.py --choices``' accuracy on the same items.
* ``loglikelihood_rolling``: the sum over the harness's disjoint rolling
  windows of the model's context (``lm_eval.utils.get_rolling_token_windows``).
* ``generate_until``: greedy (or sampled with ``do_sample`` and
  ``temperature``) continuations with the KV cache, batched
  (:func:`laplax.models.sampling.generate_batch`), the context keeping its
  last ``max_length - max_gen_toks`` tokens, cut before the first ``until``
  string; a row also stops at ``<|bos|>`` (nanochat's tokenizer).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import jax
import numpy as np
import tqdm
from lm_eval.api.model import LM
from lm_eval.api.registry import model_registry

from laplax.errors import UserError
from laplax.models import sampling

MODEL_NAME = "laplax"
DEFAULT_MAX_GEN_TOKS = 256


def _flag(value) -> bool:
  return str(value).strip().lower() in ("1", "true", "yes")


class LaplaxLM(LM):
  """A laplax GPT workdir as an lm-evaluation-harness model.

  Args:
    workdir: the run directory ``train.py --workdir`` wrote (a language model).
    step: the checkpoint to load (default: the newest readable one).
    batch_size: rows per forward pass (``"auto"`` or ``None``: 8).
    max_gen_toks: new tokens of ``generate_until`` when the task sets none.
    prefix_bos: start every context with ``<|bos|>`` (nanochat's tokenizer).

  Raises:
    laplax.loading.LoadError, DataError, ConfigError: as ``eval.py``
      (no workdir, no checkpoint, not a language model, data that cannot be
      prepared); ValueError: a BOS prefix without a BOS token.
  """

  def __init__(
    self,
    workdir: str,
    step=None,
    batch_size=8,
    max_gen_toks=DEFAULT_MAX_GEN_TOKS,
    prefix_bos=False,
    **unused,
  ):
    super().__init__()
    from laplax import loading as restore
    from laplax import tasks

    config = restore.saved_config(workdir)
    if not tasks.is_language_model(config):
      raise restore.LoadError(
        f"{workdir} holds task {config.task!r}; the harness scores language models (task 'lm')"
      )
    run = restore.load(workdir, step=None if step in (None, "") else int(step))
    self.model, self.params = run.model, run.params
    self.tokenizer = run.task.tokenizer
    self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8
    self.max_gen_toks = int(max_gen_toks)
    bos = getattr(self.tokenizer, "bos_id", None)
    self.prefix = [int(bos)] if bos is not None else [int(self.tokenizer.encode("\n\n")[-1])]
    self.prefix_bos = _flag(prefix_bos)
    if self.prefix_bos and bos is None:
      raise ValueError(
        f"prefix_bos=true needs a tokenizer with <|bos|>; {self.tokenizer.name} has none"
      )
    self.stop_tokens = () if bos is None else (int(bos),)

  def _context(self, text: str) -> list[int]:
    ids = self.tokenizer.encode(text).tolist()
    if self.prefix_bos:
      return self.prefix + ids
    return ids or list(self.prefix)

  def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
    """``(log p(continuation | context), is_greedy)`` per request (see the module)."""
    pairs = [
      (self._context(context), self.tokenizer.encode(continuation))
      for context, continuation in (r.args for r in requests)
    ]
    results = []
    for b in tqdm.trange(
      0, len(pairs), 64 * self.batch_size, desc="loglikelihood", disable=disable_tqdm
    ):
      results += sampling.continuation_logprobs(
        self.model, self.params, pairs[b : b + 64 * self.batch_size], self.batch_size
      )
    for request, result in zip(requests, results):
      self.cache_hook.add_partial("loglikelihood", request.args, result)
    return results

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
    """The log-likelihood of each whole text over rolling windows."""
    from lm_eval import utils

    totals = []
    for request in tqdm.tqdm(requests, desc="loglikelihood_rolling", disable=disable_tqdm):
      tokens = self.tokenizer.encode(request.args[0]).tolist()
      windows = [
        utils.make_disjoint_window(w)
        for w in utils.get_rolling_token_windows(
          token_list=tokens,
          prefix_token=self.prefix[0],
          max_seq_len=self.model.spec.max_length,
          context_len=1,
        )
      ]
      scores = sampling.continuation_logprobs(self.model, self.params, windows, self.batch_size)
      totals.append(float(sum(s for s, _ in scores)))
      self.cache_hook.add_partial("loglikelihood_rolling", request.args, totals[-1])
    return totals

  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    """Each context's continuation, cut before the first ``until`` string."""
    max_length = self.model.spec.max_length
    jobs = []
    for context, kwargs in (r.args for r in requests):
      kwargs = dict(kwargs or {})
      until = kwargs.get("until") or []
      until = [until] if isinstance(until, str) else list(until)
      new = int(kwargs.get("max_gen_toks", self.max_gen_toks))
      keep = max(1, max_length - new) if new < max_length else max(1, max_length // 2)
      sample = _flag(kwargs.get("do_sample", False))
      temperature = float(kwargs.get("temperature", 1.0 if sample else 0.0)) if sample else 0.0
      jobs.append((self._context(context)[-keep:], until, new, temperature))
    outputs = [""] * len(jobs)
    groups: dict = {}
    for i, (_, _, new, temperature) in enumerate(jobs):
      groups.setdefault((new, temperature), []).append(i)
    bar = tqdm.tqdm(total=len(jobs), desc="generate_until", disable=disable_tqdm)
    for (new, temperature), indices in groups.items():
      indices.sort(key=lambda i: len(jobs[i][0]))
      for b in range(0, len(indices), self.batch_size):
        chunk = indices[b : b + self.batch_size]
        rows = sampling.generate_batch(
          self.model,
          self.params,
          [jobs[i][0] for i in chunk],
          max_new_tokens=new,
          temperature=temperature,
          rng=jax.random.PRNGKey(b),
          stop_tokens=self.stop_tokens,
          rows=self.batch_size,
        )
        for i, row in zip(chunk, rows):
          outputs[i] = _cut(self.tokenizer.decode(np.asarray(row)), jobs[i][1])
        bar.update(len(chunk))
    bar.close()
    for request, text in zip(requests, outputs):
      self.cache_hook.add_partial("generate_until", request.args, text)
    return outputs


def _cut(text: str, until: Sequence[str]) -> str:
  """``text`` up to the first occurrence of any ``until`` string."""
  ends = [text.find(u) for u in until if u and u in text]
  return text[: min(ends)] if ends else text


def register() -> None:
  """Registers :class:`LaplaxLM` as ``laplax`` in the harness (next to its own
  models; idempotent)."""
  import lm_eval.models  # noqa: F401

  if model_registry.get(MODEL_NAME, None) is not LaplaxLM:
    model_registry.register(MODEL_NAME)(LaplaxLM)


if __name__ != "__main__":  # under -m, main() registers the importable module's class
  register()


def main(argv: Sequence[str] | None = None) -> None:
  """``lm_eval``'s command line with the ``laplax`` model registered; a bad
  laplax workdir (missing, no checkpoint, not a language model, data that
  cannot be prepared) is one error line and exit code 2."""
  from lm_eval.__main__ import cli_evaluate

  from laplax.cli import lm_harness

  lm_harness.register()
  if argv is not None:
    sys.argv = [sys.argv[0], *argv]
  try:
    cli_evaluate()
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  from laplax.cli.lm_harness import main as _main

  _main()
