"""A DCLM eval bundle in its published layout, written by a test: ``core.yaml``,
``eval_data/<label>.jsonl`` and ``eval_meta_data.csv`` (laplax.proj.nanochat.evaluators.core)."""

import json


def write_bundle(root, tasks):
  """``tasks``: ``(label, icl_task_type, shots, delimiter, random baseline %,
  examples)`` each; returns ``str(root)``."""
  import yaml

  (root / "eval_data").mkdir(parents=True)
  icl = []
  for label, kind, shots, delim, _, data in tasks:
    with open(root / "eval_data" / f"{label}.jsonl", "w") as f:
      f.writelines(json.dumps(x) + "\n" for x in data)
    icl.append(
      dict(
        label=label,
        icl_task_type=kind,
        dataset_uri=f"{label}.jsonl",
        num_fewshot=[shots],
        **({} if delim == " " else {"continuation_delimiter": delim}),
      )
    )
  (root / "core.yaml").write_text(yaml.safe_dump({"icl_tasks": icl}))
  rows = "Eval Task,Random baseline\n" + "".join(f"{t[0]},{t[4]}\n" for t in tasks)
  (root / "eval_meta_data.csv").write_text(rows)
  return str(root)
