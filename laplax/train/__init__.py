"""Training and evaluation: the loop, its tasks, the workdir and the CLIs.

The CLIs (:mod:`~laplax.train.train_cli`, :mod:`~laplax.train.eval_cli`, their
shared :mod:`~laplax.train.cli`) validate a config
(:mod:`~laplax.train.config`, defaults in :mod:`~laplax.train.defaults`) and
run :func:`laplax.train.loop.train_and_evaluate` on a task
(:mod:`~laplax.train.tasks`, the protocol in :mod:`~laplax.train.protocol`)
with the optimiser of :mod:`~laplax.train.optim`; the run's workdir
(:mod:`~laplax.train.workdir`, :mod:`~laplax.train.lock`), checkpoints
(:mod:`~laplax.train.checkpoint`, :mod:`~laplax.train.integrity`,
:mod:`~laplax.train.saving`) and timing (:mod:`~laplax.train.timing`,
:mod:`~laplax.train.profiler`) are their own modules;
:mod:`~laplax.train.restore` is ``laplax.load``.
"""
