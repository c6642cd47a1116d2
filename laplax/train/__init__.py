"""Training: the state (:mod:`~laplax.state`), the jitted step and the
loop (:mod:`~laplax.train.loop`, ``train_and_evaluate`` read top to bottom),
the optimisers (:mod:`~laplax.optim`, nanochat's in
:mod:`~laplax.proj.nanochat.optim`), fine-tuning from another run
(:mod:`~laplax.train.finetune`), the checks that a run fits its data and its
machine (:mod:`~laplax.train.fit`), cramming's wall-time budget and
batch-size ramp (:mod:`~laplax.train.budget`), and step timing and profiles
(:mod:`~laplax.train.timing`, :mod:`~laplax.train.profiler`).

The loop takes a validated config (:mod:`laplax.config`) and a task
(:mod:`laplax.tasks`), and writes through :mod:`laplax.workdir`; the command
lines that start it are in :mod:`laplax.cli`.
"""
