"""The WordPiece tokenizer of crammed BERT (laplax.data.text.tokenizers):
cramming's normalisation against a transcription of its rules written here
with the standard library, its word splitting against the ``Whitespace``
pattern, the ``[SEP]`` that ends every document, and BERT's older rules
kept for the runs that trained with them."""

import re
import unicodedata

import ml_collections
import numpy as np
import pytest

from laplax.config.validation import ConfigError
from laplax.data.errors import DataError
from laplax.data.text import tokenizers as tok
from laplax.tasks import mlm, schema

from helpers.configs import load

TEXTS = [
  "Café ``Naïve'' FAÇADE   Zoë's résumé — 東京 Straße!",
  "The Quick  brown fox?! It's 3.5 km, «très» loin... ÉCOLE",
  "naïve coöperation; ÀÉÎÕÜ àéîõü ñ Ø ß ﬁ ¼",
] * 20


def cramming_normalise(text: str) -> str:
  """cramming's ``_get_sane_normalizers(force_english_keyboard=True,
  force_lowercase=True, strip_accents=True)``, rule by rule."""
  text = text.replace("``", '"').replace("''", '"')
  text = unicodedata.normalize("NFD", text).lower()
  text = "".join(c for c in text if unicodedata.category(c) != "Mn")
  text = re.sub(" {2,}", " ", text)
  return re.sub(r"[^\x00-\x7F]+", "", text)


@pytest.fixture(scope="module")
def cramming():
  return tok.WordPieceTokenizer.train(TEXTS, 120, "cramming")


def test_normalisation_is_crammings(cramming):
  normalizer = cramming._tokenizer.normalizer
  for text in TEXTS[:3] + ["A  B   C", "x``y''z", "MiXeD CaSe ÅNGSTRÖM"]:
    assert normalizer.normalize_str(text) == cramming_normalise(text), text
  assert cramming_normalise("Café ``Naïve''") == 'cafe "naive"'


def test_words_split_as_whitespace_and_each_document_ends_in_sep(cramming):
  text = "the quick brown fox?! it's 3.5"
  words = [w for w, _ in cramming._tokenizer.pre_tokenizer.pre_tokenize_str(text)]
  assert words == re.findall(r"\w+|[^\w\s]+", text)
  ids = cramming.encode(TEXTS[0])
  assert ids[-1] == tok.WORDPIECE_SPECIAL.index("[SEP]")
  assert tok.WORDPIECE_SPECIAL.index("[SEP]") not in ids[:-1]
  pieces = [cramming._tokenizer.id_to_token(int(i)) for i in ids[:-1]]
  assert "".join(p.removeprefix("##") for p in pieces) == re.sub(
    r"\s", "", cramming_normalise(TEXTS[0])
  )
  # One [SEP] per document in a batch too (the corpus encodes in batches).
  assert [a.tolist() for a in cramming.encode_batch(TEXTS[:2])] == [
    cramming.encode(t).tolist() for t in TEXTS[:2]
  ]


def test_berts_rules_keep_case_and_add_no_sep():
  bert = tok.WordPieceTokenizer.train(TEXTS, 160, "bert")
  assert bert._tokenizer.normalizer.normalize_str("Café ÉCOLE") == "Café ÉCOLE"
  assert tok.WORDPIECE_SPECIAL.index("[SEP]") not in bert.encode(TEXTS[0])
  words = [w for w, _ in bert._tokenizer.pre_tokenizer.pre_tokenize_str("fox?!")]
  assert words == ["fox", "?", "!"]


def test_the_config_key_chooses_and_a_bad_value_is_one_line():
  data = ml_collections.ConfigDict(
    {"tokenizer": "wordpiece", "vocab_size": 120, "wordpiece_normalizer": "bert"}
  )
  made = tok.make_tokenizer(data, TEXTS)
  assert made._tokenizer.normalizer.normalize_str("ÉCOLE") == "ÉCOLE"
  data.wordpiece_normalizer = "lower"
  with pytest.raises(DataError, match="^--config.data.wordpiece_normalizer='lower' is unknown"):
    tok.make_tokenizer(data, TEXTS)
  config = load("bert_cramming")
  config.data.wordpiece_normalizer = "lower"
  with pytest.raises(ConfigError, match="wordpiece_normalizer='lower' is unknown"):
    mlm.MaskedLMTask.validate(config)


def test_new_runs_pack_as_cramming_old_runs_as_they_trained():
  new = load("bert_cramming")
  assert new.data.wordpiece_normalizer == "cramming" and new.mlm.cls_first is False
  glue = load("bert_glue")
  assert glue.glue.attention_dropout == 0.1 and glue.glue.dropout == 0.1
  for config, keys in ((new, ("data.wordpiece_normalizer", "mlm.cls_first")),):
    old = ml_collections.ConfigDict(config.to_dict())
    del old.data["wordpiece_normalizer"], old.mlm["cls_first"]
    completed = schema.complete(old)
    assert [completed[k.split(".")[0]][k.split(".")[1]] for k in keys] == ["bert", True]
  old = ml_collections.ConfigDict(glue.to_dict())
  del old.glue["attention_dropout"]
  assert schema.complete(old).glue.attention_dropout == 0.0


def test_masked_windows_put_cls_first_only_when_asked():
  """The packed window reaches the masking unchanged, or with [CLS] first."""
  tokens = np.arange(10, 26, dtype=np.int32).reshape(2, 8)
  for cls_first in (False, True):
    config = load("bert_cramming")
    config.mlm.cls_first = cls_first
    task = mlm.MaskedLMTask.from_shapes(config, vocab_size=64)
    seen = task.packed(tokens)
    want = tokens.copy()
    if cls_first:
      want[:, 0] = mlm.CLS_ID
    np.testing.assert_array_equal(np.asarray(seen), want)
