"""A workdir's GPT as a conversation partner (nanochat's ``Engine`` for one row).

:class:`ChatEngine` loads a language-model workdir (:func:`laplax.loading.load`
and its tokenizer). A run whose data are a chat stage (``chat_mid`` or
``chat_sft``, :mod:`laplax.proj.nanochat.data.mixture`) talks in nanochat's chat format
(:mod:`laplax.proj.nanochat.data.render`: ``<|bos|>``, ``<|user_start|>`` ... ``<|user_end|>``,
``<|assistant_start|>``); an answer ends at ``<|assistant_end|>`` or ``<|bos|>``
and uses nanochat's calculator (:class:`laplax.proj.nanochat.evaluators.generation.Calculator`:
the text between ``<|python_start|>`` and ``<|python_end|>`` is evaluated and
``<|output_start|>`` result ``<|output_end|>`` forced into the answer). Any other
run (a base model, a byte-level one) is in plain completion mode: the text is
continued as ``eval.py --sample`` continues it. Decoding is
:func:`laplax.models.sampling.stream` (the KV cache, one compiled step per
shape bucket); greedy answers equal ``eval.py --sample``'s greedy decoding of the
same prompt tokens.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from laplax import loading, tasks
from laplax.data.text.tokenizers import load_tokenizer
from laplax.errors import UserError
from laplax.models import sampling
from laplax.proj.nanochat.data.render import chat_tokens, render_for_completion
from laplax.proj.nanochat.evaluators.generation import Calculator

CHAT_DATA = ("chat_mid", "chat_sft")  # data names of the chat stages
# An answer's tool blocks as its text shows them (the special tokens' names).
_TOOL_MARKER = re.compile(
  r"(<\|python_start\|>|<\|python_end\|>|<\|output_start\|>|<\|output_end\|>)"
)
_TOOL_BLOCKS = {
  "<|python_start|>": ("python", "<|python_end|>"),
  "<|output_start|>": ("python_output", "<|output_end|>"),
}


def answer_parts(content: str) -> str | list[dict]:
  """An assistant message's text as the answer's tokens had it: each
  well-formed ``<|python_start|>`` code ``<|python_end|>`` and
  ``<|output_start|>`` result ``<|output_end|>`` (the calculator's blocks,
  streamed as the special tokens' names) a ``python`` or ``python_output``
  part (:mod:`laplax.proj.nanochat.data.render`, which renders them with their
  special tokens, as SFT trains on them); the rest ``text`` parts. A
  content without markers, or whose markers do not pair up (an answer cut
  inside a block), is returned as it is (rendered as plain text)."""
  pieces = _TOOL_MARKER.split(content)
  if len(pieces) == 1:
    return content
  parts: list[dict] = []
  kind, closing, text = "text", None, ""
  for i, piece in enumerate(pieces):
    if i % 2 == 0:
      text += piece
    elif closing is None and piece in _TOOL_BLOCKS:
      if text:
        parts.append({"type": "text", "text": text})
      (kind, closing), text = _TOOL_BLOCKS[piece], ""
    elif piece == closing:
      parts.append({"type": kind, "text": text})
      kind, closing, text = "text", None, ""
    else:
      return content
  if closing is not None:
    return content
  if text:
    parts.append({"type": "text", "text": text})
  return parts


class ChatError(UserError, ValueError):
  """A conversation the model cannot answer (too long, malformed); one line."""


class ChatEngine:
  """One model, its tokenizer and the chat format.

  It holds ``model`` and ``params`` (the GPT and its parameters), the run's
  ``tokenizer``, ``chat`` (True in chat mode, False in plain completion mode),
  ``mode_line`` (one line saying which mode and why) and ``context`` (the
  model's context in tokens, ``spec.max_length``).
  """

  def __init__(self, model: Any, params: Any, tokenizer: Any, chat: bool, why: str = ""):
    self.model, self.params, self.tokenizer, self.chat = model, params, tokenizer, chat
    self.context = int(model.spec.max_length)
    if chat:
      self.special = chat_tokens(tokenizer)
      self.stops = (self.special["<|assistant_end|>"], self.special["<|bos|>"])
      self.mode_line = f"chat mode: {why or 'a chat model'}, context {self.context} tokens"
    else:
      self.special, self.stops = {}, ()
      self.mode_line = (
        f"plain completion mode: {why or 'not a chat model'}; "
        "each prompt is continued as text (no conversation)"
      )

  @classmethod
  def load(cls, workdir: str, step: int | None = None) -> ChatEngine:
    """The engine of a ``train.py`` workdir.

    Raises:
      laplax.loading.LoadError: no workdir, no checkpoint, not a language model.
      laplax.data.errors.DataError: the tokenizer file is missing.
    """
    config = loading.saved_config(workdir)
    if not tasks.is_language_model(config):
      raise loading.LoadError(
        f"{workdir} holds task {config.task!r}; laplax-chat talks to language models (task 'lm')"
      )
    run = loading.load(workdir, step)
    tokenizer = load_tokenizer(run.config.data, workdir)
    name = run.config.data.name
    run_name = os.path.basename(os.path.normpath(workdir))  # the page shows no machine path
    if name in CHAT_DATA:
      return cls(run.model, run.params, tokenizer, True, f"{run_name} is a {name} run")
    kind = getattr(tokenizer, "name", "")
    why = (
      f"{run_name} is a byte-level run"
      if kind == "byte"
      else f"{run_name} is a base model (data {name or 'text'}, not {' or '.join(CHAT_DATA)})"
    )
    return cls(run.model, run.params, tokenizer, False, why)

  # -- prompts ---------------------------------------------------------------

  def user_turn(self, text: str) -> list[int]:
    """A user message and the start of the answer, in the chat format:
    ``<|user_start|>`` text ``<|user_end|><|assistant_start|>``."""
    s = self.special
    return [
      s["<|user_start|>"],
      *self.tokenizer.encode(text).tolist(),
      s["<|user_end|>"],
      s["<|assistant_start|>"],
    ]

  def start(self) -> list[int]:
    """The tokens a new conversation starts with (``<|bos|>``; none in completion mode)."""
    return [self.special["<|bos|>"]] if self.chat else []

  def prompt(self, messages: Sequence[dict]) -> np.ndarray:
    """The prompt of the answer to ``messages`` (``{"role", "content"}`` dicts,
    user and assistant alternating, the last the user's; an optional system
    message first): int32 ``[n]``. In completion mode, the last message's text.
    An assistant message's calculator blocks, as its streamed text shows
    them, are rendered with their special tokens (:func:`answer_parts`):
    the prompt is the one the terminal keeps for the same conversation.

    Raises:
      ChatError: a malformed conversation, or one that leaves no room for an
        answer in the model's context.
    """
    if not self.chat:
      ids = self.tokenizer.encode(str(messages[-1].get("content", "")))
    else:
      messages = [
        dict(m, content=answer_parts(m["content"]))
        if isinstance(m, dict)
        and m.get("role") == "assistant"
        and isinstance(m.get("content"), str)
        else m
        for m in messages
      ]
      conversation = {"messages": [*messages, {"role": "assistant", "content": ""}]}
      try:
        ids = render_for_completion(self.tokenizer, conversation, 1 << 30)
      except UserError as e:
        raise ChatError(str(e).replace("conversation: ", "")) from None
    if len(ids) == 0:
      raise ChatError("the prompt is empty; send some text")
    if len(ids) >= self.context:
      raise ChatError(
        f"the conversation is {len(ids)} tokens but the model's context is "
        f"{self.context}; start a new chat"
      )
    return np.asarray(ids, np.int32)

  # -- answers ---------------------------------------------------------------

  def tokens(
    self,
    prompt: Sequence[int],
    *,
    max_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    seed: int = 0,
    calculator: bool = True,
  ) -> Iterator[int]:
    """The answer's token ids as they are decoded (the stop token not
    included; the calculator's forced output included). Chat mode stops at
    a full context; completion mode slides on as ``eval.py --sample``.

    Raises:
      ChatError: an empty prompt or one that fills the context.
    """
    prompt = np.asarray(prompt, np.int32)
    if prompt.size == 0 or prompt.size > self.context:
      raise ChatError(f"the prompt needs 1 to {self.context} tokens; it has {prompt.size}")
    tool = None
    if self.chat and calculator:
      calc = Calculator(self.tokenizer)
      tool = lambda token: calc(0, token)
    return sampling.stream(
      self.model,
      self.params,
      prompt,
      max_new_tokens=max_tokens,
      temperature=temperature,
      top_k=top_k,
      rng=jax.random.PRNGKey(seed),
      stop_tokens=self.stops,
      tool=tool,
      slide=not self.chat,
    )

  def texts(self, tokens: Iterable[int], out: list[int] | None = None) -> Iterator[str]:
    """The text of ``tokens`` piece by piece as they arrive (nanochat's
    ``chat_web.py``: the whole answer is decoded each time and only text that
    does not end in a partial UTF-8 character, U+FFFD, is given out). The
    tokens are appended to ``out`` when given."""
    seen: list[int] = [] if out is None else out
    shown = ""
    for token in tokens:
      seen.append(int(token))
      text = self.tokenizer.decode(np.asarray(seen, np.int32))
      if not text.endswith("\ufffd") and len(text) > len(shown):
        yield text[len(shown) :]
        shown = text
