"""FineWeb-Edu input and nanochat's tokenizer (laplax.data.text.fineweb,
laplax.data.text.nanochat_tokenizer), checked against references written from
nanochat's definitions: a pure-Python BPE trainer, the packed token stream
built with plain lists, and bits per byte in NumPy. The parquet shards are
written here."""

import collections
import json
import math
import os
import pickle

import numpy as np
import pytest
import regex

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from laplax.data.errors import DataError  # noqa: E402
from laplax.data.text import (
  fineweb,  # noqa: E402
  tokenizers,  # noqa: E402
)
from laplax.data.text import nanochat_tokenizer as nt  # noqa: E402

WORDS = (
  "the of and a to in is you that it he was for on are as with his they at be "
  "this have from naïve café 你好 12 345 6789 don't I'm\n"
).split(" ")
VOCAB = 300  # 256 bytes + 35 merges + 9 special tokens


def _docs(rng, n):
  return [
    "".join(" " + w for w in rng.choice(WORDS, rng.integers(3, 30))).strip() or "x"
    for _ in range(n)
  ]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
  """Three train shards and one validation shard, 24 documents in row groups of 4."""
  d = tmp_path_factory.mktemp("fineweb")
  rng = np.random.default_rng(0)
  for i in range(4):
    pq.write_table(
      pa.table({"text": _docs(rng, 24)}), d / f"shard_{i:05d}.parquet", row_group_size=4
    )
  return str(d)


@pytest.fixture(scope="module")
def tok(shards):
  return nt.NanochatTokenizer.train(fineweb.iter_documents(fineweb.list_shards(shards)[:-1]), VOCAB)


def _config(shards, **kw):
  c = fineweb.default_config()
  c.source_dir, c.vocab_size, c.prefetch = shards, VOCAB, 0
  c.update(kw)
  return c


# --------------------------------------------------------------------------
# The tokenizer.


def reference_bpe(texts, num_merges):
  """BPE by definition: split by the pattern, count chunks, merge the most
  frequent adjacent pair (ties: the smallest pair of ids) ``num_merges`` times."""
  counts = collections.Counter(
    tuple(c.encode()) for t in texts for c in regex.findall(nt.SPLIT_PATTERN, t)
  )
  words = {w: list(w) for w in counts}
  vocab = {i: bytes([i]) for i in range(256)}
  for m in range(num_merges):
    pairs = collections.Counter()
    for w, ids in words.items():
      for pair in zip(ids, ids[1:]):
        pairs[pair] += counts[w]
    best = max(pairs.values())
    pair = min(p for p, c in pairs.items() if c == best)
    vocab[256 + m] = vocab[pair[0]] + vocab[pair[1]]
    for w, ids in words.items():
      out, i = [], 0
      while i < len(ids):
        if tuple(ids[i : i + 2]) == pair:
          out.append(256 + m)
          i += 2
        else:
          out.append(ids[i])
          i += 1
      words[w] = out
  return {v: k for k, v in vocab.items()}


def test_rustbpe_merges_equal_the_definition():
  rng = np.random.default_rng(1)
  texts = _docs(rng, 30) + ["aaaa abab baba aa bb ab ba " * 3]  # ties between pairs
  tok = nt.NanochatTokenizer.train(texts, 265 + 80)
  assert tok.encoding._mergeable_ranks == reference_bpe(texts, 80)


def test_ids_specials_and_round_trip(tok):
  assert tok.vocab_size == VOCAB and tok.bos_id == VOCAB - 9
  assert [tok.encoding.encode_single_token(s) for s in nt.SPECIAL_TOKENS] == list(
    range(VOCAB - 9, VOCAB)
  )
  text = "Unicode: 你好世界 🌍 <|bos|> don't 123456\r\n  x"
  ids = tok.encode(text)
  assert tok.bos_id not in ids  # special strings are plain text (encode_ordinary)
  assert tok.decode(ids) == text
  docs = tok.encode_documents(["ab", "c"])
  assert [d.tolist() for d in docs] == [
    [tok.bos_id] + tok.encode("ab").tolist(),
    [tok.bos_id] + tok.encode("c").tolist(),
  ]
  with pytest.raises(ValueError, match="token ids must be in"):
    tok.decode([VOCAB])


def test_token_bytes_is_the_length_of_the_replaced_decoding():
  ranks = {bytes([i]): i for i in range(256)}
  ranks.update({b"\xe4\xbd": 256, b"\xe4\xbd\xa0": 257, b"ab": 258})  # half of 你, 你, ab
  tok = nt.NanochatTokenizer.from_ranks(ranks)
  expected = np.array(
    [
      len(tok.encoding.decode_single_token_bytes(i).decode("utf-8", "replace").encode())
      for i in range(259)
    ]
    + [0] * 9
  )
  np.testing.assert_array_equal(tok.token_bytes, expected)
  assert tok.token_bytes[0x80] == 3 and tok.token_bytes[256] == 3  # one U+FFFD each
  assert tok.token_bytes[257] == 3 and tok.token_bytes[258] == 2 and tok.token_bytes[ord("a")] == 1


def test_files_round_trip_and_nanochat_pickle_loads(tok, tmp_path):
  tok.save(str(tmp_path / "w" / nt.TOKENIZER_FILE))
  tok.save_nanochat(str(tmp_path / "n"))
  for path in (tmp_path / "w", tmp_path / "n", tmp_path / "n" / nt.PICKLE_FILE):
    back = nt.NanochatTokenizer.from_path(str(path))
    assert back.fingerprint == tok.fingerprint
    np.testing.assert_array_equal(back.encode("the café 12345"), tok.encode("the café 12345"))
  # nanochat's own file: pickle.dump of the tiktoken Encoding.
  with open(tmp_path / "n" / nt.PICKLE_FILE, "rb") as f:
    assert pickle.load(f)._mergeable_ranks == tok.encoding._mergeable_ranks


class _Evil:
  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (open, (self.marker, "w"))


class _EncodingWithEvilState:
  """Pickles as nanochat's Encoding (the tiktoken class, then its state) with
  a state whose ranks hold a call to ``open``."""

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    import tiktoken

    state = {
      "name": "x",
      "pat_str": nt.SPLIT_PATTERN,
      "special_tokens": {},
      "mergeable_ranks": {b"a": _Evil(self.marker)},
    }
    return (tiktoken.Encoding, (), state)


@pytest.mark.parametrize("how", ["top", "inside the state"])
def test_a_pickle_that_runs_code_is_refused_and_nothing_runs(tmp_path, how):
  marker = str(tmp_path / "ran")
  path = tmp_path / nt.PICKLE_FILE
  payload = _Evil(marker) if how == "top" else _EncodingWithEvilState(marker)
  data = pickle.dumps(payload)
  assert (b"tiktoken.core" in data) == (how != "top")
  path.write_bytes(data)
  with pytest.raises(DataError) as e:
    nt.read_tokenizer_pkl(str(path))
  assert "Refused" in str(e.value) and "io.open" in str(e.value)
  assert "\n" not in str(e.value)
  assert not os.path.exists(marker)


def test_a_pickle_of_other_data_is_refused(tmp_path):
  path = tmp_path / nt.PICKLE_FILE
  path.write_bytes(pickle.dumps({"mergeable_ranks": {b"a": 0}}))
  with pytest.raises(DataError, match="not a tiktoken encoding's data"):
    nt.read_tokenizer_pkl(str(path))


def test_training_cli_writes_both_files_and_bad_dir_is_exit_2(shards, tmp_path, capsys):
  out = tmp_path / "tok"
  assert (
    nt.main(
      [
        "--source_dir",
        shards,
        "--out",
        str(out),
        "--vocab_size",
        str(VOCAB),
        "--max_chars",
        "500",
        "--doc_cap",
        "50",
      ]
    )
    == 0
  )
  a = nt.NanochatTokenizer.from_path(str(out / nt.TOKENIZER_FILE))
  b = nt.NanochatTokenizer.from_path(str(out / nt.PICKLE_FILE))
  assert a.fingerprint == b.fingerprint and a.vocab_size == VOCAB
  docs = list(fineweb.iter_documents(fineweb.list_shards(shards)[:-1]))
  used = list(nt.training_texts(docs, 500, 50))
  assert all(len(t) <= 50 for t in used) and sum(map(len, used[:-1])) <= 500 < sum(map(len, used))
  assert a.fingerprint == nt.NanochatTokenizer.train(used, VOCAB).fingerprint
  capsys.readouterr()
  assert nt.main(["--source_dir", str(tmp_path / "none"), "--out", str(out)]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error:") and "does not exist" in err and "\n" not in err


def test_config_kinds_make_and_load(tok, tmp_path):
  c = _config("unused", tokenizer="nanochat")
  assert tokenizers.tokenizer_kind(c) == "nanochat"
  with pytest.raises(DataError, match="No nanochat tokenizer nanochat_tokenizer.json"):
    tokenizers.load_tokenizer(c, str(tmp_path))
  tok.save(tokenizers.tokenizer_path(str(tmp_path), "nanochat"))
  assert tokenizers.load_tokenizer(c, str(tmp_path)).fingerprint == tok.fingerprint
  c.vocab_size = 264
  with pytest.raises(DataError, match=">= 265 for the nanochat tokenizer"):
    tokenizers.tokenizer_kind(c)


# --------------------------------------------------------------------------
# The packed stream.


def reference_stream(shards, tok, split, stream, streams):
  """Stream ``stream``'s tokens by definition: sorted files (the last is
  validation), row groups stream, stream + streams, ... of each, each
  document [BOS] + encode_ordinary(text), concatenated."""
  paths = sorted(os.path.join(shards, n) for n in os.listdir(shards))
  paths = paths[:-1] if split == "train" else paths[-1:]
  out = []
  for p in paths:
    f = pq.ParquetFile(p)
    for g in range(stream, f.num_row_groups, streams):
      for text in f.read_row_group(g).column("text").to_pylist():
        out += [tok.bos_id] + tok.encoding.encode_ordinary(text)
  return out


def reference_batches(stream_tokens, num_batches, rows_per_stream, pop_rows, seq_len):
  """Global batches: each stream's rows in stream order, popped R * T + 1 at a time."""
  cursors, batches = [0] * len(stream_tokens), []
  for _ in range(num_batches):
    rows = []
    for s, toks in enumerate(stream_tokens):
      for _ in range(rows_per_stream // pop_rows):
        n = pop_rows * seq_len + 1
        x = [toks[(cursors[s] + i) % len(toks)] for i in range(n)]
        cursors[s] += n
        rows += [x[i * seq_len : i * seq_len + seq_len + 1] for i in range(pop_rows)]
    batches.append(np.array(rows))
  return batches


@pytest.mark.parametrize("streams,pop_rows", [(1, None), (2, 1), (3, 2)])
def test_train_batches_equal_the_definition(shards, tok, streams, pop_rows):
  seq_len, batch = 8, 6 if streams == 3 else 4
  c = _config(shards, streams=streams, pop_rows=pop_rows)
  it = iter(fineweb.train_dataset(c, tok, batch_size=batch, seq_len=seq_len))
  refs = [reference_stream(shards, tok, "train", s, streams) for s in range(streams)]
  per = batch // streams
  # Enough batches to cross row groups, files and (one stream) the end of the split.
  n = max(len(r) for r in refs) // (batch * seq_len) + 3
  for got, want in zip(
    (next(it)["tokens"] for _ in range(n)),
    reference_batches(refs, n, per, pop_rows or per, seq_len),
  ):
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_resume_from_any_state_is_exact(shards, tok, prefetch):
  c = _config(shards, streams=2, prefetch=prefetch)
  ds = fineweb.train_dataset(c, tok, batch_size=4, seq_len=16)
  it = iter(ds)
  batches, states = [], []
  for _ in range(12):
    states.append(json.loads(json.dumps(it.get_state())))  # as the checkpoint stores it
    batches.append(next(it)["tokens"])
  for k in (0, 5, 11):
    again = iter(ds)
    again.set_state(states[k])
    for b in batches[k : k + 2]:
      np.testing.assert_array_equal(next(again)["tokens"], b)
  other = iter(fineweb.train_dataset(_config(shards, streams=1), tok, batch_size=4, seq_len=16))
  with pytest.raises(DataError, match="of 2 FineWeb-Edu streams"):
    other.set_state(states[3])


def test_processes_read_their_streams_and_save_every_position(shards, tok):
  c = _config(shards, streams=4)
  whole = iter(fineweb.train_dataset(c, tok, batch_size=8, seq_len=8))
  seen = {}

  def gather(local):  # stands in for the all-gather: every process's positions so far
    seen.update({k: tuple(v) for k, v in local.items()})
    return [{k: list(v)} for k, v in seen.items()]

  parts = [
    iter(
      fineweb.train_dataset(
        c, tok, batch_size=4, seq_len=8, process_index=p, process_count=2, gather=gather
      )
    )
    for p in range(2)
  ]
  for _ in range(5):
    np.testing.assert_array_equal(
      np.concatenate([next(p)["tokens"] for p in parts]), next(whole)["tokens"]
    )
  parts[0].get_state()
  state = parts[1].get_state()
  assert state == whole.get_state()  # all four streams, from both processes
  resumed = iter(
    fineweb.train_dataset(
      c, tok, batch_size=4, seq_len=8, process_index=0, process_count=2, gather=gather
    )
  )
  resumed.set_state(state)
  np.testing.assert_array_equal(next(resumed)["tokens"], next(whole)["tokens"][:4])


def test_more_processes_than_streams_share_them_and_keep_the_batch(shards, tok):
  """8 streams on a 16-host slice, here 2 streams on 4 processes: each
  process reads the one stream its rows are in and keeps its half of that
  stream's rows, so the processes' rows, in process order, are the batch of
  one process; their positions (the same for the two sharing a stream) are
  the whole run's."""
  c = _config(shards, streams=2)
  whole = iter(fineweb.train_dataset(c, tok, batch_size=8, seq_len=8))
  seen = {}

  def gather(local):
    seen.update({k: tuple(v) for k, v in local.items()})
    return [{k: list(v)} for k, v in seen.items()]

  parts = [
    iter(
      fineweb.train_dataset(
        c, tok, batch_size=2, seq_len=8, process_index=p, process_count=4, gather=gather
      )
    )
    for p in range(4)
  ]
  for _ in range(5):
    got = [next(p)["tokens"] for p in parts]
    assert all(g.shape == (2, 9) for g in got)
    np.testing.assert_array_equal(np.concatenate(got), next(whole)["tokens"])
  states = [p.get_state() for p in parts]  # a collective: every process asks
  assert states[-1] == whole.get_state()
  assert fineweb.process_streams(2, 8, 1, 4) == (range(0, 1), slice(2, 4))
  assert fineweb.process_streams(4, 8, 1, 2) == (range(2, 4), slice(0, 4))
  with pytest.raises(DataError, match="streams=2 must be a multiple or a divisor of the 3"):
    fineweb.geometry(c, 6, 3)


def test_allgather_positions_pass_through_jax(monkeypatch):
  from jax.experimental import multihost_utils

  other = np.array([[2, 7, 11], [3, 0, 5]], np.int64)  # process 1's streams 2 and 3
  monkeypatch.setattr(multihost_utils, "process_allgather", lambda x: np.stack([x, other]))
  parts = fineweb._allgather_positions({"1": [4, 9], "0": [1, 2]})
  assert parts == [{"0": [1, 2], "1": [4, 9]}, {"2": [7, 11], "3": [0, 5]}]


def test_eval_batches_are_the_validation_streams(shards, tok):
  seq_len, w = 8, 2
  c = _config(shards, streams=w, max_eval_tokens=3 * 2 * seq_len * w + 5)  # 3 pops a stream
  got = list(fineweb.eval_batches(c, tok, batch_size=5, seq_len=seq_len, train_batch_size=4))
  refs = [reference_stream(shards, tok, "validation", s, w) for s in range(w)]
  rows = []
  for p in range(3):  # pop-major
    for r in refs:
      x = r[p * (2 * seq_len + 1) : (p + 1) * (2 * seq_len + 1)]
      rows += [x[i * seq_len : i * seq_len + seq_len + 1] for i in range(2)]
  assert len(got) == 3  # 12 rows in batches of 5
  np.testing.assert_array_equal(np.concatenate([b["tokens"] for b in got])[:12], rows)
  assert [b["mask"].sum() for b in got] == [5 * seq_len, 5 * seq_len, 2 * seq_len]
  assert not got[-1]["tokens"][2:].any()
  whole = list(
    fineweb.eval_batches(
      _config(shards, streams=w), tok, batch_size=5, seq_len=seq_len, train_batch_size=4
    )
  )
  pops = min(len(r) - 1 for r in refs) // (2 * seq_len + 1)  # until a stream runs out
  assert sum(b["mask"].sum() for b in whole) == pops * w * 2 * seq_len


@pytest.mark.parametrize(
  "change,batch,seq_len,message",
  [
    ({"streams": 3}, 4, 8, "must be a positive integer dividing the batch size 4"),
    ({"streams": 9}, 9, 8, "at most 6 row groups"),
    ({"pop_rows": 3}, 4, 8, "dividing the 4 rows of each stream"),
    ({}, 4, 10_000, "fewer tokens than one pop of each stream (4 x 10000 + 1)"),
    ({"max_eval_tokens": 10}, 4, 8, "max_eval_tokens=10 must be None"),
    ({"tokenizer": "bpe"}, 4, 8, "needs --config.data.tokenizer=nanochat"),
    ({"source_dir": "/nonexistent/fineweb"}, 4, 8, "does not exist"),
  ],
)
def test_bad_settings_are_one_line_errors(shards, tmp_path, change, batch, seq_len, message):
  c = _config(shards, **change)
  with pytest.raises(DataError) as e:
    fineweb.prepare(c, str(tmp_path / "w"), batch_size=batch, seq_len=seq_len)
  assert message in str(e.value) and "\n" not in str(e.value)
  assert not (tmp_path / "w").exists()  # nothing written


def test_prepare_trains_once_then_reads_the_workdir_or_tokenizer_dir(shards, tok, tmp_path):
  c = _config(shards, tokenizer_max_chars=10**9)
  first = fineweb.prepare(c, str(tmp_path / "a"))
  assert first.fingerprint == tok.fingerprint  # all train documents, cut at 10,000 chars
  assert fineweb.prepare(c, str(tmp_path / "a")).fingerprint == tok.fingerprint
  tok.save_nanochat(str(tmp_path / "nano"))
  c.tokenizer_dir = str(tmp_path / "nano")
  assert fineweb.prepare(c, str(tmp_path / "b")).fingerprint == tok.fingerprint
  assert os.path.isfile(tmp_path / "b" / nt.TOKENIZER_FILE)
  c.vocab_size = 400
  with pytest.raises(DataError, match="has 300 tokens but --config.data.vocab_size=400"):
    fineweb.prepare(c, str(tmp_path / "c"))


# --------------------------------------------------------------------------
# Bits per byte, and configs/gpt_d20.py end to end.


def _tiny_task(config_data, tokenizer):
  import ml_collections

  from laplax.config import defaults
  from laplax.tasks import LanguageModelTask

  c = defaults.gpt_base_config()
  c.model.update(width=16, depth=1, num_heads=2, mlp_dim=32, max_length=8)
  c.data = config_data
  return LanguageModelTask(ml_collections.ConfigDict(c), tokenizer)


@pytest.mark.slow
def test_bits_per_byte_is_nanochats_definition(shards, tok):
  import jax

  task = _tiny_task(_config(shards), tok)
  params = task.init(jax.random.PRNGKey(0))
  batch = next(
    b
    for b in fineweb.eval_batches(_config(shards), tok, batch_size=4, seq_len=8, train_batch_size=4)
    if (b["tokens"][:3, 1:] == tok.bos_id).any()
  )
  batch["mask"][3, 5:] = 0.0  # some targets not scored
  targets = batch["tokens"][:, 1:]
  assert (targets[batch["mask"] > 0] == tok.bos_id).any()  # a special token is a target
  # NumPy from the definition.
  logits = np.asarray(
    task.model.apply({"params": params}, batch["tokens"][:, :-1], train=False)[0], np.float64
  )
  logp = logits - logits.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  nats = -np.take_along_axis(logp, targets[..., None], -1)[..., 0] * batch["mask"]
  table = np.array(
    [len(tok.encoding.decode([i]).encode()) for i in range(tok.vocab_size - 9)] + [0] * 9
  )
  nbytes = table[targets] * batch["mask"]
  want = (nats * (nbytes > 0)).sum() / (math.log(2) * nbytes.sum())
  got = task.summarize(jax.device_get(task.eval_sums(params, batch)))
  assert got["bits_per_byte"] == pytest.approx(want, rel=1e-5)
  assert nats.sum() / (math.log(2) * nbytes.sum()) > want * 1.01  # the special targets matter
  assert got["loss"] == pytest.approx(nats.sum() / batch["mask"].sum(), rel=1e-5)


@pytest.mark.slow
def test_byte_tokenizer_bits_per_byte_is_unchanged():
  import jax

  from laplax.data.text import corpus as text

  task = _tiny_task(text.default_config(), tokenizers.ByteTokenizer())
  params = task.init(jax.random.PRNGKey(0))
  tokens = np.arange(36, dtype=np.int32).reshape(4, 9) + 60
  sums = jax.device_get(task.eval_sums(params, {"tokens": tokens, "mask": np.ones((4, 8))}))
  assert "byte_loss" not in sums  # bits per byte = the summed loss / ln 2 / bytes, as before
  assert task.summarize(sums)["bits_per_byte"] == float(sums["loss"]) / math.log(2) / 32.0


@pytest.mark.slow
def test_gpt_d20_trains_on_parquet_shards(shards, tmp_path):
  from helpers.runs import ROOT, run_in_process

  workdir = tmp_path / "run"
  argv = [
    "train.py",
    "--config",
    os.path.join(ROOT, "configs", "gpt_d20.py"),
    "--workdir",
    str(workdir),
    f"--config.data.source_dir={shards}",
    f"--config.data.vocab_size={VOCAB}",
    "--config.data.streams=2",
    "--config.data.max_eval_tokens=64",
    "--config.data.prefetch=0",
    "--config.model.width=16",
    "--config.model.depth=1",
    "--config.model.num_heads=2",
    "--config.model.num_laplacian_heads=1",
    "--config.model.mlp_dim=32",
    "--config.model.max_length=8",
    "--config.batch_size=4",
    "--config.eval_batch_size=4",
    "--config.total_steps=2",
    "--config.eval_every=2",
    "--config.checkpoint_every=2",
    "--config.eval.sample_tokens=0",
  ]
  r = run_in_process(argv)
  assert r.returncode == 0
  config = json.loads((workdir / "config.json").read_text())
  assert config["data"]["name"] == "fineweb_edu" and config["data"]["tokenizer"] == "nanochat"
  evals = [json.loads(l) for l in open(workdir / "metrics.jsonl") if '"eval"' in l]
  assert evals[-1]["num_tokens"] == 8 * 8 and 0 < evals[-1]["bits_per_byte"] < 20
  # eval.py reads the workdir's tokenizer and the same validation rows.
  assert run_in_process(["eval.py", "--workdir", str(workdir)]).returncode == 0
  result = json.loads((workdir / "eval.json").read_text())
  assert result["bits_per_byte"] == pytest.approx(evals[-1]["bits_per_byte"], rel=1e-5)
  # The checkpoint holds the data position two batches on: resuming reads batch 3.
  with open(workdir / "checkpoints" / "2" / "data" / "metadata") as f:
    saved = json.load(f)
  tok = nt.NanochatTokenizer.from_path(str(workdir))
  it = iter(fineweb.train_dataset(_config(shards, streams=2), tok, batch_size=4, seq_len=8))
  next(it), next(it)
  assert saved == it.get_state()


def test_text_corpus_with_the_nanochat_tokenizer_saves_and_reloads_it(tmp_path):
  from laplax.data.text import corpus as text

  corpus = tmp_path / "corpus"
  corpus.mkdir()
  for name in "abc":
    (corpus / f"{name}.txt").write_text("the cat sat on the mat. " * 50)
  c = text.default_config()
  c.update(
    source_dir=str(corpus), data_dir=str(tmp_path / "tfds"), tokenizer="nanochat", vocab_size=270
  )
  tok = text.prepare(c, str(tmp_path / "w"), seq_len=16)
  assert isinstance(tok, nt.NanochatTokenizer) and tok.vocab_size == 270
  assert os.listdir(tmp_path / "w") == [nt.TOKENIZER_FILE]
  again = text.prepare(c, str(tmp_path / "w"), seq_len=16)  # read, not trained
  assert again.fingerprint == tok.fingerprint
  np.testing.assert_array_equal(
    text.split_tokens(c, tok, "validation")[:12], tok.encode("the cat sat on the mat. " * 50)[:12]
  )
