"""The cookbook notebooks execute end to end (small settings: NEST_COOKBOOK_SMALL=1)."""

from __future__ import annotations

from pathlib import Path

import pytest

COOKBOOK = Path(__file__).resolve().parent.parent / "cookbook"
NOTEBOOKS = sorted(COOKBOOK.glob("*.ipynb"))

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("NEST_COOKBOOK_SMALL", "1")
    notebook = nbformat.read(path, as_version=4)
    assert any(cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), "saved outputs are missing"
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(COOKBOOK)}}).execute()


def test_every_notebook_is_collected():
    names = {p.name for p in NOTEBOOKS}
    assert {
        "01_langchain_quickstart.ipynb",
        "02_llamaindex_query_engine.ipynb",
        "03_nest_vs_in_context_rag.ipynb",
        "04_own_documents.ipynb",
    } <= names
