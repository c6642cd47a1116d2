"""The command lines: ``train.py`` / ``laplax-train`` (:mod:`laplax.cli.train`),
``eval.py`` / ``laplax-eval`` (:mod:`laplax.cli.eval`) and what they share
(:mod:`laplax.cli.common`: flags, the one-line error handler, the model of an
``init_from`` run). ``python -m laplax.sweep`` and ``python -m
laplax.convert`` keep their own modules (:mod:`laplax.sweep`,
:mod:`laplax.convert`), as their ``-m`` names are part of the contract."""
