"""Evaluators of trained models, one module each (see the repository layout in
the README); :mod:`laplax.evaluators.humaneval` scores code completions."""
