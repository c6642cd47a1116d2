"""A byte-level nanochat tokenizer (256 ranks) for the chat tests."""

from laplax.data.text import nanochat_tokenizer as nt

TOK = nt.NanochatTokenizer.from_ranks({bytes([b]): b for b in range(256)})
