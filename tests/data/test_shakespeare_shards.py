"""laplax.data.text.shakespeare_shards: the works as parquet shards in the
FineWeb-Edu layout (the validation works last) and the stand-in CORE bundle
that laplax.proj.nanochat.evaluators.core reads."""

import pytest

from laplax.data.text import fineweb_shards
from laplax.data.text import shakespeare_shards as shards
from laplax.proj.nanochat.evaluators import core

pq = pytest.importorskip("pyarrow.parquet")

PLAY = """ACT I.

MACBETH.
So foul and fair a day I have not seen.
How far is't call'd to Forres? What are these
So wither'd, and so wild in their attire,
That look not like the inhabitants o' the earth,
And yet are on't? Live you? or are you aught

[Exit.]

BANQUO.
The earth hath bubbles, as the water has,
And these are of them. Whither are they vanish'd?
Into the air; and what seem'd corporal melted
As breath into the wind. Would they had stay'd!
"""


def test_shards_and_bundle(tmp_path):
  src = tmp_path / "src"
  src.mkdir()
  for name in ("a", "b", "c"):
    (src / f"{name}.txt").write_text(PLAY.replace("MACBETH", name.upper()) * 3)
  paths, validation = shards.write_shards(str(tmp_path / "shards"), str(src), chunk_chars=200)
  assert [p.rsplit("/", 1)[1] for p in paths] == [f"shard_0000{k}.parquet" for k in range(3)]
  assert fineweb_shards.list_shards(str(tmp_path / "shards")) == paths
  rows = [pq.read_table(p).column("text").to_pylist() for p in paths]
  # Fewer than 10 works: the last one is the validation split, in order.
  assert len(validation) == 1 and "\n\n".join(rows[-1]) == validation[0]
  assert sorted(rows[0] + rows[1]) == sorted(
    shards.documents((PLAY.replace("MACBETH", "A") * 3).strip(), 200)
    + shards.documents((PLAY.replace("MACBETH", "B") * 3).strip(), 200)
  )
  assert shards.verse_lines("MACBETH.\nSo foul and fair a day\n[Exit.]\nOne two three four")[0] == [
    "So foul and fair a day"
  ]
  bundle = shards.write_core_bundle(str(tmp_path / "bundle"), validation, n=12, seed=1)
  tasks = core.read_bundle(bundle)
  assert [(t["label"], t["kind"], t["shots"], t["delim"], t["baseline"]) for t in tasks] == [
    tuple(x) for x in shards.CORE_TASKS
  ]
  assert all(len(t["data"]) == 12 for t in tasks)
  lines = {line for r in shards.verse_lines(validation[0]) for line in r}
  for item in tasks[0]["data"]:  # the true next line is among four verse lines
    assert item["query"] in lines and len(set(item["choices"])) == 4
  for item in tasks[3]["data"]:
    assert item["continuation"] and " " not in item["continuation"]
  encode = lambda s: list(s.encode())  # noqa: E731
  assert [len(core.task_examples(t, encode, 0)) for t in tasks] == [12] * 4
