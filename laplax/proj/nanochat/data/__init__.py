"""nanochat's chat data: the conversations' sources in their published formats
(:mod:`~laplax.proj.nanochat.data.sources`), the chat format
(:mod:`~laplax.proj.nanochat.data.render`), the mid-training and SFT mixtures
(:mod:`~laplax.proj.nanochat.data.mixture`) and small synthetic stand-ins
(:mod:`~laplax.proj.nanochat.data.fixtures`).

Imported, it registers the mixtures as the language-model inputs
``data.name="chat_mid"`` and ``"chat_sft"`` (SFT's batches carry
``"targets"``) of :mod:`laplax.data.lm_input`.
"""

from laplax.data import lm_input

lm_input.register_input("chat_mid", "laplax.proj.nanochat.data.mixture")
lm_input.register_input("chat_sft", "laplax.proj.nanochat.data.mixture", targets=True)
