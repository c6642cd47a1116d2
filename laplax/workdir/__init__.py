"""A run's directory and everything read from or written to it.

* :mod:`laplax.workdir.files`: ``config.json``, ``metrics.jsonl``,
  TensorBoard and Weights & Biases, the checks before a run uses a workdir;
* :mod:`laplax.workdir.checkpoint`: orbax checkpoints, with the checksums of
  :mod:`laplax.workdir.integrity`;
* :mod:`laplax.workdir.lock`: ``train.lock``, one writer per workdir;
* :mod:`laplax.workdir.saving`: the one-line error of a write that fails
  (a full disk) and disk-space helpers;
* :mod:`laplax.loading`: ``laplax.load``, a trained run back in memory.
"""
