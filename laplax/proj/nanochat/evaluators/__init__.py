"""nanochat's evaluators, registered in :mod:`laplax.evaluators.registry` when
imported (:func:`laplax.projects.discover`): the chat benchmarks ``arc_easy``,
``arc_challenge``, ``mmlu``, ``gsm8k``, ``humaneval``, ``spellingbee`` and
ChatCORE (:mod:`~laplax.proj.nanochat.evaluators.chat`, scored by
:mod:`~laplax.proj.nanochat.evaluators.multiple_choice`,
:mod:`~laplax.proj.nanochat.evaluators.gsm8k`,
:mod:`~laplax.proj.nanochat.evaluators.humaneval` (its programs run in
:mod:`laplax.sandbox`) and :mod:`~laplax.proj.nanochat.evaluators.spellingbee`,
with :mod:`~laplax.proj.nanochat.evaluators.generation` for the answers), and
a base model's CORE metric ``core`` (:mod:`~laplax.proj.nanochat.evaluators.core`).
"""

from laplax.proj.nanochat.evaluators import chat, core  # noqa: F401  (their classes register)
