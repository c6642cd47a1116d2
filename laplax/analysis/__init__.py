"""What the heads do to a trained model: ``eval.py --analysis`` and its parts.

:mod:`~laplax.analysis.report` runs the analysis over a split (token
geometry of :mod:`~laplax.analysis.geometry`, conditioning of
:mod:`~laplax.analysis.conditioning`, read from the model by
:mod:`~laplax.analysis.capture`); :mod:`~laplax.analysis.summary`,
:mod:`~laplax.analysis.plots` and :mod:`~laplax.analysis.compare` turn its
``analysis.json`` into tables and figures; :mod:`~laplax.evaluators.probes` and
:mod:`~laplax.evaluators.linear_segmentation` are the frozen-feature evaluations of
DINO; :mod:`~laplax.analysis.seeds` gathers results over seeds.
"""
