"""Run configs: every key with its default (:mod:`laplax.config.defaults`, which
each ``configs/*.py`` starts from), the one place a config is completed with
the defaults of the keys it lacks (:mod:`laplax.tasks.schema`: on load and in
``train.py``), the checks a config passes before anything runs, section by
section into the typed run spec that ``train.py`` and ``eval.py`` build once
(:mod:`laplax.config.run`; helpers in :mod:`laplax.config.validation`, one
:class:`~laplax.config.validation.ConfigError` line per problem). The
settings of nanochat's mid-training and SFT stages are the project's
(:mod:`laplax.proj.nanochat.stages`)."""
