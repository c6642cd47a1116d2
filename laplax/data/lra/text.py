"""LRA Text and Retrieval: byte-level IMDb reviews and AAN citation pairs.

Text (Tay et al. 2021, ``lra_benchmarks/text_classification/
input_pipeline.py``): TFDS ``imdb_reviews`` (``plain_text``), its ``test``
split both for validation and test as the release does, each review encoded
by tfds' ``ByteTextEncoder`` (a UTF-8 byte ``b`` is id ``b + 1``, 0 is
padding: 257 ids), cut at the config's length and zero-padded (LRA's own
text config: 4,000; the Nystromformer authors' data preparation: 1,000,
``configs/nystrom_lra.py``).

Retrieval (``lra_benchmarks/matching/input_pipeline.py``): the release's
``lra_release/tsv_data/new_aan_pairs.{train,eval,test}.tsv``, tab-separated
without a header or quoting, five fields ``label id1 id2 text1 text2``
(``label`` written ``0.0`` or ``1.0``); both texts byte-encoded as above and
cut at 4,000 each. The model encodes the two documents with one encoder and
classifies ``[u, v, u * v, u - v]`` of their pooled features
(:class:`laplax.models.encoder.DualEncoder`).

The TFDS dataset must be prepared in ``array_record`` format (``tfds build
imdb_reviews --file_format=array_record`` on a machine with internet, the
folder copied); nothing is downloaded here.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow_datasets as tfds

from laplax.data.errors import DataError

#: Ids of the byte encoding: 0 = padding, byte b -> b + 1.
VOCAB_SIZE = 257
#: ``data.eval_split`` -> the TFDS split of ``imdb_reviews`` (the release has no validation split).
IMDB_SPLITS = {"train": "train", "val": "test", "test": "test"}
#: ``data.eval_split`` -> the suffix of the release's AAN files.
AAN_SPLITS = {"train": "train", "val": "eval", "test": "test"}
AAN_PREFIX = "new_aan_pairs"


def encode_bytes(text: str | bytes, max_length: int) -> np.ndarray:
  """Byte ids ``int32 [max_length]`` of ``text`` (UTF-8 byte + 1, as tfds'
  ``ByteTextEncoder``), cut at ``max_length``, zero-padded."""
  raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
  ids = np.zeros(max_length, np.int32)
  b = np.frombuffer(raw[:max_length], np.uint8)
  ids[: len(b)] = b.astype(np.int32) + 1
  return ids


def open_tfds(name: str, split: str, data_dir: str):
  """The TFDS data source of ``split`` of ``name`` (nothing downloaded).

  Raises:
    DataError: the dataset is not prepared (in ``array_record``) in ``data_dir``.
  """
  data_dir = os.path.expanduser(data_dir)
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  except Exception as e:  # tfds raises NotImplementedError, ValueError, AssertionError, ...
    detail = " ".join(str(e).split())[:160] or type(e).__name__
    raise DataError(
      f"cannot read split {split!r} of TFDS {name!r} from {data_dir} ({detail}); prepare it "
      f"with `tfds build {name} --data_dir=DIR --file_format=array_record` where there is "
      f"internet and set --config.data.data_dir=DIR"
    ) from e


def load_imdb(data_dir: str, split: str, max_length: int) -> dict:
  """``{"tokens": int32 [n, max_length], "mask": bool, "label": int32 [n]}``
  of ``split`` (``train``, ``val`` or ``test``; module docstring).

  Raises:
    DataError: as :func:`open_tfds`, or an example without ``text``/``label``.
  """
  source = open_tfds("imdb_reviews", IMDB_SPLITS[split], data_dir)
  try:
    rows = [(source[i]["text"], int(source[i]["label"])) for i in range(len(source))]
  except (KeyError, TypeError) as e:
    raise DataError(f"TFDS imdb_reviews in {data_dir} has no 'text'/'label' ({e})") from e
  if not rows:
    raise DataError(f"TFDS imdb_reviews split {split!r} in {data_dir} is empty")
  ids = np.stack([encode_bytes(t, max_length) for t, _ in rows])
  return {"tokens": ids, "mask": ids != 0, "label": np.asarray([y for _, y in rows], np.int32)}


def read_aan(path: str) -> list[tuple[int, bytes, bytes]]:
  """``(label, text1, text2)`` (texts as bytes) of the release's ``new_aan_pairs.*.tsv`` (module docstring).

  Raises:
    DataError: a missing file, a line without five tab-separated fields, a
      label other than 0 or 1 (one line naming the file and the line).
  """
  if not os.path.isfile(path):
    raise DataError(
      f"AAN file {path} is missing; set --config.data.data_dir to the release's "
      f"lra_release/tsv_data folder (it holds {AAN_PREFIX}.{{train,eval,test}}.tsv)"
    )
  rows = []
  with open(path, "rb") as f:
    for line_no, line in enumerate(f, start=1):
      fields = line.rstrip(b"\r\n").split(b"\t")
      label = None
      if len(fields) == 5:
        try:
          label = float(fields[0])
        except ValueError:
          pass
      if label not in (0.0, 1.0):
        raise DataError(
          f"{path}:{line_no}: expected 'label<TAB>id1<TAB>id2<TAB>text1<TAB>text2' with a label "
          f"0 or 1, got {line[:60]!r}; not an AAN release file"
        )
      rows.append((int(label), fields[3], fields[4]))
  return rows


def load_aan(data_dir: str, split: str, max_length: int) -> dict:
  """``{"tokens", "mask", "tokens2", "mask2": [n, max_length], "label": int32 [n]}``
  of ``DATA_DIR/new_aan_pairs.{train,eval,test}.tsv``.

  Raises:
    DataError: as :func:`read_aan`, or an empty file.
  """
  path = os.path.join(os.path.expanduser(data_dir), f"{AAN_PREFIX}.{AAN_SPLITS[split]}.tsv")
  rows = read_aan(path)
  if not rows:
    raise DataError(f"{path} has no examples; copy the release's file again")
  a = np.stack([encode_bytes(t, max_length) for _, t, _ in rows])
  b = np.stack([encode_bytes(t, max_length) for _, _, t in rows])
  labels = np.asarray([y for y, _, _ in rows], np.int32)
  return {"tokens": a, "mask": a != 0, "tokens2": b, "mask2": b != 0, "label": labels}
