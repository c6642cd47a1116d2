"""Run configs: every key with its default (:mod:`laplax.config.defaults`, which
each ``configs/*.py`` starts from) and the checks a config passes before
anything runs (:mod:`laplax.config.validation`, one
:class:`~laplax.config.validation.ConfigError` line per problem), and the
settings of nanochat's mid-training and SFT stages
(:mod:`laplax.config.chat_stages`)."""
