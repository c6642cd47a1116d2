"""Training: the state, the step and the loop, the optimiser.

The CLIs (:mod:`~laplax.cli.train`, :mod:`~laplax.cli.eval`, their
shared :mod:`~laplax.cli.common`) validate a config
(:mod:`~laplax.config.validation`, defaults in :mod:`~laplax.config.defaults`) and
run :func:`laplax.train.loop.train_and_evaluate` on a task
(:mod:`~laplax.tasks`, the protocol in :mod:`~laplax.tasks.base`)
with the optimiser of :mod:`~laplax.train.optim`; the run's workdir
(:mod:`~laplax.workdir.files`, :mod:`~laplax.workdir.lock`), checkpoints
(:mod:`~laplax.workdir.checkpoint`, :mod:`~laplax.workdir.integrity`,
:mod:`~laplax.workdir.saving`) and timing (:mod:`~laplax.train.timing`,
:mod:`~laplax.train.profiler`) are their own modules;
:mod:`~laplax.workdir.load` is ``laplax.load``.
"""
