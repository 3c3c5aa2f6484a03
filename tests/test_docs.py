"""The examples in docs/*.md run as written."""

import doctest
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.parametrize("page", ["formats.md", "api.md"])
def test_doc_examples(page):
    pytest.importorskip("torch")
    result = doctest.testfile(
        str(DOCS / page), module_relative=False, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
    )
    assert result.attempted > 10 and result.failed == 0
