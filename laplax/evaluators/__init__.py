"""Evaluators of trained models, chosen by name in ``config.evals``: each is
a subclass of :class:`laplax.evaluators.base.Evaluator` in a module of this
package (with the mathematics it uses), which
:mod:`laplax.evaluators.registry` finds. ``classification`` and
``bits_per_byte``: :mod:`~laplax.evaluators.eval_sums`; ``samples`` and
``multiple_choice``: :mod:`~laplax.evaluators.lm_samples`; DINO's ``knn``,
``linear_probe``, ``raw_pixel_knn``, ``patch_pca``:
:mod:`~laplax.evaluators.probes`; ``segmentation``:
:mod:`~laplax.evaluators.dino_segmentation` (with
:mod:`~laplax.evaluators.linear_segmentation`). A project adds its own
(:func:`laplax.projects.discover`): nanochat's chat benchmarks and CORE are
in :mod:`laplax.proj.nanochat.evaluators`.
:mod:`laplax.cli.lm_harness` is the lm-evaluation-harness adapter (it needs
``lm-eval``)."""
