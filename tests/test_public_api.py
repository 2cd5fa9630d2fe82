"""The package's top-level names: what ``from nest_integrations import ...`` offers, lazily."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import nest_integrations

README_NAMES = ["NestIndex", "NestDecoder", "NestConfig", "NestOutput", "load_lm", "load_wikipedia_summaries", "Passage"]


def test_public_names_are_the_submodules_objects():
    """Each top-level name is the very object its submodule defines (no copy, no wrapper)."""
    for name in nest_integrations.__all__:
        module = importlib.import_module(f"nest_integrations.{nest_integrations._EXPORTS[name]}")
        assert getattr(nest_integrations, name) is getattr(module, name), name


def test_readme_names_import_from_the_package():
    from nest_integrations import NestConfig, NestDecoder, NestIndex, NestOutput, load_lm  # noqa: F401

    assert set(README_NAMES) <= set(nest_integrations.__all__)
    assert NestConfig().mode == "nest"


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        nest_integrations.NoSuchThing  # noqa: B018
    with pytest.raises(ImportError):
        from nest_integrations import NoSuchThing  # noqa: F401


def test_type_checking_block_matches_the_exports():
    """Type checkers see exactly the names ``__getattr__`` serves, from the same modules."""
    tree = ast.parse(Path(nest_integrations.__file__).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    seen = {alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert seen == nest_integrations._EXPORTS


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_the_package_loads_no_heavy_dependency():
    """``import nest_integrations`` (what every submodule import pays first) stays cheap."""
    out = _run(
        "import sys, nest_integrations; "
        "print(sorted(m for m in ('torch', 'transformers', 'numpy', 'langchain_core', 'llama_index') if m in sys.modules))"
    )
    assert out == "[]"


def test_config_without_torch():
    """The configuration can be built and validated without loading torch."""
    out = _run("import sys; from nest_integrations import NestConfig; NestConfig(gamma=0.01); print('torch' in sys.modules)")
    assert out == "False"
