"""Karpathy's nanochat reproduced on laplax: one project, one folder.

nanochat (``karpathy/nanochat``, first release 3a5e0bc, and the Laplacian
authors' fork ``yuchongzhang/nanochat``) trains a GPT in stages: base
pre-training on FineWeb-Edu, mid-training and SFT on chat conversations,
then chat evaluation and a chat program. The library holds what is not
nanochat's own: the GPT (:mod:`laplax.models.gpt`, ``rope_style`` and
``kernel_init`` ``"nanochat"``), the language-model task, FineWeb-Edu's
parquet input and nanochat's tokenizer (:mod:`laplax.data.text`), the
recipes (:func:`laplax.config.defaults.nanochat_options`) and the weight
converter (``python -m laplax.convert --from nanochat``). This folder holds
the rest:

* :mod:`~laplax.proj.nanochat.optim`: nanochat's optimisers,
  ``optim.optimizer="nanochat"`` (Muon + AdamW, :mod:`~laplax.proj.nanochat.optim.first_release`)
  and ``"nanochat-fork"`` (:mod:`~laplax.proj.nanochat.optim.fork`);
* :mod:`~laplax.proj.nanochat.data`: the chat data sets in their published
  formats, nanochat's chat format and the mid-training and SFT mixtures,
  ``data.name="chat_mid"`` and ``"chat_sft"``;
* :mod:`~laplax.proj.nanochat.stages`: the chat stages as config settings
  (``configs/gpt_*_mid.py``, ``configs/gpt_*_sft.py``);
* :mod:`~laplax.proj.nanochat.evaluators`: the chat benchmarks (ARC, MMLU,
  GSM8K, HumanEval in :mod:`laplax.sandbox`, SpellingBee), ChatCORE and the
  base model's CORE metric, ``config.evals`` names and ``eval.py --chat_tasks``;
* :mod:`~laplax.proj.nanochat.chat`: ``laplax-chat`` (``python -m
  laplax.proj.nanochat.chat``), a conversation in the terminal or a web page.

The library does not import this package; its registries find the entries
above through :func:`laplax.projects.discover` (the ``optim``, ``data`` and
``evaluators`` modules register them when imported). The user guides are
``docs/language-models.md`` (the stages), ``docs/evaluation.md`` (the
benchmarks) and ``docs/chat.md``.
"""
