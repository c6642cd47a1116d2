"""nanochat's chat format: conversations rendered to token ids and loss masks.

A conversation is ``{"messages": [...]}`` (other keys are kept for the
evaluators, e.g. ``"letters"``). The messages are an optional ``system``
message, then ``user`` and ``assistant`` messages alternating, starting with
``user``. A user message's ``content`` is a string; an assistant's is a
string or a list of parts ``{"type": "text" | "python" | "python_output",
"text": str}`` (a calculator call and its result).

:func:`render_conversation` follows Karpathy's nanochat
(``nanochat/tokenizer.py``, ``RustBPETokenizer.render_conversation``):

=================================================  ============
tokens                                             loss mask
=================================================  ============
``<|bos|>``                                        0
``<|user_start|>`` user text ``<|user_end|>``      0
``<|assistant_start|>``                            0
assistant text (a string or ``text`` parts)        1
``<|python_start|>`` code ``<|python_end|>``       1
``<|output_start|>`` output ``<|output_end|>``     0
``<|assistant_end|>``                              1
=================================================  ============

A system message is merged into the first user message as ``system + "\\n\\n"
+ user``. Texts are encoded as plain text (special-token strings inside them
are not special). The ids and the mask are cut to ``max_tokens`` (nanochat:
2048). :func:`render_for_completion` is the prompt a model answers: the
conversation without its last (assistant) message, rendered and cut the same
way, then ``<|assistant_start|>``.

The tokenizer must be nanochat's
(:class:`~laplax.data.text.nanochat_tokenizer.NanochatTokenizer`, whose last nine
ids are the special tokens); any other
raises :class:`~laplax.data.errors.DataError` from :func:`chat_tokens`.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from laplax.data.errors import DataError
from laplax.data.text.nanochat_tokenizer import SPECIAL_TOKENS

MAX_TOKENS = 2048  # nanochat's render_conversation default
PART_TYPES = ("text", "python", "python_output")


def chat_tokens(tokenizer: Any) -> dict[str, int]:
  """The ids of the nine special tokens, by name (``"<|user_start|>"`` -> id).

  Raises:
    DataError: the tokenizer has no chat special tokens (a byte or GPT-2 BPE
      tokenizer): one line saying which tokenizer a chat model needs.
  """
  special = getattr(getattr(tokenizer, "encoding", None), "_special_tokens", None)
  if not isinstance(special, dict) or not all(s in special for s in SPECIAL_TOKENS):
    name = getattr(tokenizer, "name", type(tokenizer).__name__)
    raise DataError(
      f"The tokenizer ({name}) has no chat special tokens "
      f"({', '.join(SPECIAL_TOKENS[1:5])}, ...); chat rendering and evaluation "
      "need a run trained with --config.data.tokenizer=nanochat."
    )
  return {s: int(special[s]) for s in SPECIAL_TOKENS}


def check_conversation(conversation: Any, where: str = "conversation") -> list[dict]:
  """The messages of ``conversation`` with a system message merged into the
  first user message (a new list; the input is not changed).

  Raises:
    DataError: not a dict with a non-empty ``messages`` list, roles that do
      not alternate user/assistant (after an optional system message), a user
      content that is not a string, an assistant content that is neither a
      string nor a list of known parts (``where`` names the item).
  """
  messages = conversation.get("messages") if isinstance(conversation, dict) else None
  if not isinstance(messages, list) or not messages:
    raise DataError(f"{where}: expected {{'messages': [...]}} with at least one message.")
  if not all(isinstance(m, dict) for m in messages):
    raise DataError(f"{where}: every message must be an object with 'role' and 'content'.")
  messages = copy.deepcopy(messages)
  if messages[0].get("role") == "system":
    if len(messages) < 2 or messages[1].get("role") != "user":
      raise DataError(f"{where}: a system message must be followed by a user message.")
    system, user = messages[0].get("content"), messages[1].get("content")
    if not isinstance(system, str) or not isinstance(user, str):
      raise DataError(f"{where}: system and user contents must be strings.")
    messages = [dict(messages[1], content=system + "\n\n" + user)] + messages[2:]
  for i, message in enumerate(messages):
    role, content = message.get("role"), message.get("content")
    expected = "user" if i % 2 == 0 else "assistant"
    if role != expected:
      raise DataError(
        f"{where}: message {i} is from {role!r} but should be from "
        f"{expected!r} (user and assistant alternate, user first)."
      )
    if role == "user" and not isinstance(content, str):
      raise DataError(f"{where}: message {i}: a user content must be a string.")
    if role == "assistant" and not isinstance(content, str):
      if not isinstance(content, list) or not all(
        isinstance(p, dict) and p.get("type") in PART_TYPES and isinstance(p.get("text"), str)
        for p in content
      ):
        raise DataError(
          f"{where}: message {i}: an assistant content must be a string or "
          f"a list of {{'type': {'|'.join(PART_TYPES)}, 'text': str}} parts."
        )
  return messages


def render_conversation(
  tokenizer: Any, conversation: dict, max_tokens: int = MAX_TOKENS, where: str = "conversation"
) -> tuple[np.ndarray, np.ndarray]:
  """A conversation as nanochat trains on it (see the module docstring).

  Args:
    tokenizer: a tokenizer with the chat special tokens (:func:`chat_tokens`).
    conversation: ``{"messages": [...]}``.
    max_tokens: keep the first ``max_tokens`` ids and mask values.
    where: names the conversation in errors.

  Returns:
    ``(ids int32 [n], mask int8 [n])``, ``n <= max_tokens``: mask 1 where the
    assistant is trained (the next-token target at position ``t`` is
    ``ids[t]`` when ``mask[t] == 1``).

  Raises:
    DataError: see :func:`chat_tokens` and :func:`check_conversation`.
  """
  special = chat_tokens(tokenizer)
  messages = check_conversation(conversation, where)
  ids: list[int] = []
  mask: list[int] = []

  def add(tokens, value):
    tokens = [tokens] if isinstance(tokens, int) else [int(t) for t in tokens]
    ids.extend(tokens)
    mask.extend([value] * len(tokens))

  add(special["<|bos|>"], 0)
  for message in messages:
    content = message["content"]
    if message["role"] == "user":
      add(special["<|user_start|>"], 0)
      add(tokenizer.encode(content), 0)
      add(special["<|user_end|>"], 0)
      continue
    add(special["<|assistant_start|>"], 0)
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
    for part in parts:
      text = tokenizer.encode(part["text"])
      if part["type"] == "text":
        add(text, 1)
      elif part["type"] == "python":
        add(special["<|python_start|>"], 1)
        add(text, 1)
        add(special["<|python_end|>"], 1)
      else:  # python_output: the tool writes it at test time, never trained
        add(special["<|output_start|>"], 0)
        add(text, 0)
        add(special["<|output_end|>"], 0)
    add(special["<|assistant_end|>"], 1)
  return (np.asarray(ids[:max_tokens], np.int32), np.asarray(mask[:max_tokens], np.int8))


def render_for_completion(
  tokenizer: Any, conversation: dict, max_tokens: int = MAX_TOKENS, where: str = "conversation"
) -> np.ndarray:
  """The prompt of the assistant's answer: every message but the last
  (which must be the assistant's) rendered and cut to ``max_tokens``, then
  ``<|assistant_start|>``; int32 ``[n <= max_tokens + 1]``.

  Raises:
    DataError: the last message is not the assistant's, or see
      :func:`render_conversation`.
  """
  messages = check_conversation(conversation, where)
  if messages[-1]["role"] != "assistant":
    raise DataError(
      f"{where}: the last message must be the assistant's (the answer the prompt asks for)."
    )
  ids, _ = render_conversation(tokenizer, {"messages": messages[:-1]}, max_tokens, where)
  return np.append(ids, np.int32(chat_tokens(tokenizer)["<|assistant_start|>"]))
