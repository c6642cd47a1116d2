"""The documentation site: built with warnings as errors, its links checked.

``sphinx-build -W -b html docs OUT`` (the README's docs command) fails on any
warning: a broken cross-reference to a laplax object or a page, a docstring
that is not valid reStructuredText, a page outside every table of contents,
or a public laplax module, class or function without a docstring
(``docs/conf.py``). The built pages are then crawled for links inside the
site that lead nowhere. The README stays a front page (at most 250 lines)
whose relative links exist, and the API page lists exactly ``laplax``'s public
names.
"""

import ast
import html.parser
import os
import re
import subprocess
import sys
import urllib.parse

import pytest

from helpers.runs import ROOT

DOCS = os.path.join(ROOT, "docs")


class _Links(html.parser.HTMLParser):
  """Collects the ``href`` and ``src`` attributes of a page."""

  def __init__(self):
    super().__init__()
    self.links = []

  def handle_starttag(self, tag, attrs):
    self.links += [v for k, v in attrs if k in ("href", "src") and v]


def _broken_internal_links(site: str) -> list[str]:
  """``page: link`` for each link of the built site's pages to a file it lacks
  (the theme's templates under ``_static`` are not pages)."""
  broken = []
  for folder, dirs, files in os.walk(site):
    dirs[:] = [d for d in dirs if d not in ("_static", "_sources")]  # the theme's and page sources
    for name in files:
      if not name.endswith(".html"):
        continue
      page = os.path.join(folder, name)
      parser = _Links()
      with open(page, encoding="utf-8") as f:
        parser.feed(f.read())
      for link in parser.links:
        parts = urllib.parse.urlsplit(link)
        if parts.scheme or parts.netloc or not parts.path:
          continue  # another site, mailto:, or an anchor of this page
        target = os.path.normpath(os.path.join(folder, urllib.parse.unquote(parts.path)))
        if not os.path.exists(target):
          broken.append(f"{os.path.relpath(page, site)}: {link}")
  return broken


@pytest.mark.slow
@pytest.mark.subprocess
def test_site_builds_without_warnings_and_its_links_resolve(tmp_path):
  out = str(tmp_path / "html")
  r = subprocess.run(
    [sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", DOCS, out],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
  for page in (
    "index.html",
    "api.html",
    "methods.html",
    "demo.html",
    "searchindex.js",
    os.path.join("_autosummary", "laplax.attention.html"),
  ):
    assert os.path.isfile(os.path.join(out, page)), page
  with open(os.path.join(out, "index.html"), encoding="utf-8") as f:  # getting started
    page = f.read()
  assert "laplax.MultiHeadAttention" in page and "scripts/install.sh" in page  # the README's parts
  with open(os.path.join(out, "_autosummary", "laplax.attention.html"), encoding="utf-8") as f:
    assert 'id="laplax.attention.attend"' in f.read()  # a docstring became an entry
  assert not _broken_internal_links(out), _broken_internal_links(out)


def test_link_crawl_finds_a_broken_link(tmp_path):
  (tmp_path / "a.html").write_text(
    '<a href="b.html#x">b</a> <a href="https://x.org/c">c</a> '
    '<a href="#top">t</a> <img src="_static/missing.png">'
  )
  (tmp_path / "b.html").write_text("<p>b</p>")
  assert _broken_internal_links(str(tmp_path)) == ["a.html: _static/missing.png"]


def test_readme_is_a_front_page_whose_links_exist():
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    text = f.read()
  assert len(text.splitlines()) <= 250
  targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
  assert len(targets) >= 15, targets  # the links to the site's pages were found
  missing = [t for t in targets if "://" not in t and not os.path.exists(os.path.join(ROOT, t))]
  assert not missing, missing
  # Every page of the site is reachable from the README in one click.
  pages = {n for n in os.listdir(DOCS) if n.endswith(".md")} - {"index.md"}
  linked = {os.path.basename(t) for t in targets if t.startswith("docs/")}
  assert pages <= linked, sorted(pages - linked)


def _public_names() -> dict:
  with open(os.path.join(ROOT, "laplax", "__init__.py"), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  for node in tree.body:
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_PUBLIC":
      return ast.literal_eval(node.value)
  raise AssertionError("laplax/__init__.py has no _PUBLIC")


def test_api_page_lists_exactly_the_public_names():
  with open(os.path.join(DOCS, "api.md"), encoding="utf-8") as f:
    listed = re.findall(r"^   ~(laplax\.[\w.]+)$", f.read(), flags=re.M)
  expected = [f"{module}.{attribute}" for module, attribute in _public_names().values()]
  assert sorted(listed) == sorted(expected)


def _launch_sections() -> str:
  """scale-out.md's "Run on a TPU pod slice" and "Run on a GPU cluster"."""
  with open(os.path.join(DOCS, "scale-out.md"), encoding="utf-8") as f:
    text = f.read()
  return text.split("\n## Run on a TPU pod slice\n", 1)[1].split("\n## Will it fit?", 1)[0]


def test_launch_commands_print_what_the_docs_show(tmp_path):
  """Each documented ``--dry-run`` command prints exactly the ``text`` block
  after it (run as written, from the repository's root, with no ``gcloud``,
  ``srun`` or ``sbatch`` on PATH), and the documented ``sbatch`` submits the
  job that the SLURM block prints."""
  blocks = re.findall(r"^```(\w+)\n(.*?)^```$", _launch_sections(), re.S | re.M)
  pairs = [(code, blocks[i + 1]) for i, (kind, code) in enumerate(blocks) if "--dry-run" in code]
  assert len(pairs) == 8, [code for code, _ in pairs]
  env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
  env["PATH"] = f"{tmp_path}:/usr/bin:/bin"  # nothing of a cloud or a cluster to run
  for code, (kind, printed) in pairs:
    assert kind == "text", code
    r = subprocess.run(
      ["bash", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30
    )
    assert (r.returncode, r.stderr) == (0, ""), code
    assert r.stdout == printed, (code, r.stdout)
  (sbatch,) = [code for _, code in blocks if code.startswith("cd laplax\nsbatch ")]
  (job,) = [code for code, _ in pairs if "slurm_job.sh" in code]

  def words_after_script(code):
    words = code.replace("\\\n", " ").split()
    return [w for w in words[words.index("scripts/slurm_job.sh") + 1 :] if w != "--dry-run"]

  assert words_after_script(sbatch) == words_after_script(job)
