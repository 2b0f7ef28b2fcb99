"""Every relative link and every repository path named in the docs points at something that exists.

Checked: README.md, docs/**/*.md, the folder READMEs (every README.md outside docs/, the virtual
environments and runs/), and the comments of configs/**/*.yaml.

- A markdown link ``[text](target)`` or image ``![alt](target)`` whose target is not a URL or an
  in-page anchor must exist relative to the file that holds it (a ``#section`` suffix is dropped).
- A repository path named in the text, in backticks or code blocks or prose (``docs/rl.md``,
  ``train/scripts/cluster_node.sh``), must exist relative to the repository root when its first
  component is one of the repository's tracked top-level folders (``r3rag``, ``docs``, ``tool``,
  ...). Paths that commands create or that name placeholders are not files of the repository and
  are left alone: anything under ``runs/`` or ``.venvs/`` (not tracked top-level folders), paths
  with a placeholder or wildcard (``*``, ``{...}``, ``<...>``, ``$VAR``, upper-case words such as
  ``WORK`` or ``DIR``), and paths that only look like one because they lack a file name with an
  extension or a trailing slash (``r3rag.train.rl`` is a module, not a path).
- Files that ``python -m r3rag.data.fetch`` writes under ``data/`` (its catalogue's outputs: the
  benchmarks, training questions, wiki18) are made by a command, not tracked: they are accepted.
- A results page not written yet may be linked before it lands: the names in ``PENDING`` are
  accepted until they exist (then they are checked like any other).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: results pages and guides that are linked from the docs but written on other branches
PENDING: set[str] = set()

def _fetched() -> set[str]:
    from r3rag.data.fetch.catalog import catalog

    return {f"data/{item.output}" for item in catalog().values()} | {"data/fetch_manifest.json"}


#: files the fetch command writes (made by a command, never tracked)
FETCHED = _fetched()

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# a path: top-level folder, then /segments; the last segment has an extension or the path ends in /
PATH = re.compile(r"(?<![\w./$-])((?:[A-Za-z0-9_.-]+/)+(?:[A-Za-z0-9_.-]+\.[A-Za-z0-9]+|(?=[\s`'\")\]:,;]|$)))")
PLACEHOLDER = re.compile(r"[*{}<>$]|(?:^|/)[A-Z][A-Z0-9_]*(?:/|$|\.)")


def _tracked_top_dirs() -> set[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {line.split("/", 1)[0] for line in out.splitlines() if "/" in line}


def doc_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    files = []
    for rel in out:
        p = ROOT / rel
        if not p.is_file():
            continue
        if rel == "README.md" or (rel.startswith("docs/") and rel.endswith(".md")) or rel.endswith("/README.md"):
            files.append(p)
        elif rel.startswith("configs/") and rel.endswith((".yaml", ".yml")):
            files.append(p)
    return sorted(files)


def _text_to_check(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    if path.suffix in {".yaml", ".yml"}:  # only the comments
        return "\n".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line)
    return text


def broken_links(path: Path, parent: Path | None = None) -> list[str]:
    """Link targets of ``path`` that do not exist, resolved against ``parent`` (default: its folder)."""
    parent = parent or path.parent
    bad = []
    for target in LINK.findall(_text_to_check(path)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (http:, mailto:) or an anchor in the same page
        rel = target.split("#", 1)[0]
        resolved = (parent / rel).resolve()
        try:
            repo_rel = resolved.relative_to(ROOT).as_posix()
        except ValueError:
            bad.append(f"{target} (outside the repository)")
            continue
        if not resolved.exists() and repo_rel not in PENDING | FETCHED:
            bad.append(target)
    return bad


def named_paths(text: str, tops: set[str]) -> list[str]:
    out = []
    for m in PATH.finditer(text):
        p = m.group(1).rstrip(".")
        first = p.split("/", 1)[0]
        if first not in tops or PLACEHOLDER.search(p):
            continue
        out.append(p)
    return out


def broken_paths(path: Path, tops: set[str]) -> list[str]:
    text = LINK.sub(" ", _text_to_check(path))  # link targets are checked relative to the file
    return sorted({p for p in named_paths(text, tops) if not (ROOT / p).exists() and p not in PENDING | FETCHED})


FILES = doc_files()


def test_the_docs_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in FILES}
    assert {"README.md", "docs/rl.md", "tool/README.md", "configs/README.md", "docs/results/README.md"} <= names
    assert any(n.startswith("configs/") and n.endswith(".yaml") for n in names)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_exists(path):
    assert broken_links(path) == [], f"{path.relative_to(ROOT)}: links to missing files"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_named_repository_path_exists(path):
    assert broken_paths(path, _tracked_top_dirs()) == [], f"{path.relative_to(ROOT)}: names missing paths"


def test_the_checks_catch_a_broken_link_and_a_missing_path(tmp_path):
    """The mechanism itself: a page with one good and one broken link, one real and one missing
    repository path, and the paths the rule leaves alone (runs/, placeholders, modules)."""
    doc = tmp_path / "probe.md"  # read as if it sat in docs/
    doc.write_text(
        "[good](rl.md) [bad](no_such_page.md) [url](https://example.org/x.md) [anchor](#top)\n"
        "`tool/build_index.py` and `tool/no_such_tool.py`; runs/quickstart/report/x.md; "
        "WORK/sft/config.yaml; configs/rl/*.yaml; r3rag.train.rl; docs/results/\n"
        "[pending](results/index_scale.md)\n", encoding="utf-8")
    assert broken_links(doc, parent=ROOT / "docs") == ["no_such_page.md"]
    assert broken_paths(doc, _tracked_top_dirs()) == ["tool/no_such_tool.py"]


def test_yaml_comments_are_checked_not_values(tmp_path):
    cfg = tmp_path / "x.yaml"
    cfg.write_text("output:\n  dir: runs/x/none.json  # written by docs/no_such_guide.md\n", encoding="utf-8")
    text = _text_to_check(cfg)
    assert "runs/x/none.json" not in text and named_paths(text, {"docs"}) == ["docs/no_such_guide.md"]
