"""Evaluators of trained models, one module each: :mod:`laplax.evaluators.humaneval`
scores code completions in :mod:`laplax.evaluators.sandbox`; nanochat's chat evaluations
are :mod:`laplax.evaluators.chat` (the tasks, ChatCORE, ``eval.py
--chat_tasks``), :mod:`laplax.evaluators.multiple_choice` (ARC, MMLU),
:mod:`laplax.evaluators.gsm8k` and :mod:`laplax.evaluators.generation`
(batched answers with the calculator tool); :mod:`laplax.cli.lm_harness`
is the lm-evaluation-harness adapter (it needs ``lm-eval``)."""
