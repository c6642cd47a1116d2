"""Evaluators of trained models, one module each: :mod:`laplax.evaluators.humaneval`
scores code completions in :mod:`laplax.sandbox`."""
