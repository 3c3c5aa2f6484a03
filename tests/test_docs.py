"""The examples in docs/*.md run as written; docs/performance.md is what its generator writes from the files it
lists; every benchmarks/ script the docs name exists."""

import doctest
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


@pytest.mark.parametrize("page", ["formats.md", "api.md"])
def test_doc_examples(page):
    pytest.importorskip("torch")
    result = doctest.testfile(
        str(DOCS / page), module_relative=False, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
    )
    assert result.attempted > 10 and result.failed == 0


def test_performance_page_is_generated_from_the_files_it_lists():
    """docs/performance.md is never edited by hand: regenerated (without its plots) from
    docs/results/performance_runs.txt it is the committed page, and every file it links exists."""
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "benchmarks/performance_page.py", "@docs/results/performance_runs.txt"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == (DOCS / "performance.md").read_text(), (
        "docs/performance.md differs from what benchmarks/performance_page.py writes: regenerate it with the command "
        "at its end"
    )
    linked = re.findall(r"\]\((results/[^)]+)\)", done.stdout)
    assert linked and [p for p in linked if not (DOCS / p).is_file()] == []


def test_docs_keep_only_the_results_the_performance_page_cites():
    """docs/results/ holds what the page reads and draws, the raw files the measured table's sources name, and the
    runs architecture.md's decisions cite."""
    cited = (DOCS / "performance.md").read_text()
    cited += (ROOT / "packages/b12x-core/src/b12x_core/timings.json").read_text()
    cited += (DOCS / "architecture.md").read_text()  # a decision cites the run that settled it
    kept = {p.name for p in (DOCS / "results").iterdir()} - {"performance_runs.txt"}
    assert sorted(name for name in kept if f"results/{name}" not in cited) == []


def test_every_benchmark_the_docs_name_exists():
    """A benchmarks/ script named in README.md or docs/*.md is in the tree."""
    named = set()
    for page in [ROOT / "README.md", *DOCS.glob("*.md")]:
        named |= set(re.findall(r"\b(benchmarks/[\w./-]+\.py)\b", page.read_text()))
    assert named and sorted(p for p in named if not (ROOT / p).is_file()) == []
