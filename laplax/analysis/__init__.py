"""What the heads do to a trained model: ``eval.py --analysis`` and its parts.

:mod:`~laplax.analysis.report` runs it, from :mod:`~laplax.analysis.geometry`,
:mod:`~laplax.analysis.conditioning` and :mod:`~laplax.analysis.capture`; the other
modules turn ``analysis.json`` into tables and figures.
"""
