"""Every script under ``results/`` and ``benchmarks/`` still runs against the library and the
benchmarks project: it imports, defines ``main``, and every ``nest_integrations`` and
``nest_benchmarks`` name it imports exists; and every ``results/`` path the two packages'
docstrings and comments cite as evidence is there.

The docs cite these scripts' output files as the evidence for defaults and figures, so a module
moved or a name removed must break here, not months later in the hands of whoever re-runs one.
Importing a script runs nothing (its work is in ``main``, behind ``__name__ == "__main__"``); the
imports inside functions (start-up scripts import inside ``main`` to time each import) are read
from the source, since importing the script does not reach them.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import re
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "results").rglob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))
PACKAGES = ("nest_integrations", "nest_benchmarks")
"""The packages whose imports are checked: the library and the benchmarks project."""
PACKAGE_DIRS = (ROOT / "nest_integrations", ROOT / "benchmarks" / "nest_benchmarks")
RESULTS_PATH = re.compile(r"(?<![\w/.-])results/[\w./-]*[\w/]")


def package_imports(source: str) -> list[tuple[int, str, str | None]]:
    """``(line, module, name)`` for every absolute import of one of :data:`PACKAGES` anywhere in
    ``source`` (function bodies included); ``name`` is None for ``import module``."""
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names if alias.name.split(".")[0] in PACKAGES]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in PACKAGES:
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
    return found


def unresolved(module: str, name: str | None) -> str | None:
    """Why ``from module import name`` (``import module`` when name is None) fails, or None."""
    try:
        imported = importlib.import_module(module)
    except ImportError as err:
        return f"{module}: {err}"
    if name is None or hasattr(imported, name):
        return None
    if hasattr(imported, "__path__") and importlib.util.find_spec(f"{module}.{name}") is not None:
        return None  # a submodule of a package, not imported yet
    return f"{module} has no {name}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_script_imports_and_defines_main(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = "results_script_" + "_".join(script.relative_to(ROOT).with_suffix("").parts).replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # as `python script.py` has it: dataclasses look it up
    spec.loader.exec_module(module)
    assert callable(getattr(module, "main", None)), f"{script.relative_to(ROOT)} defines no main()"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_script_package_imports_exist(script: Path) -> None:
    errors = [
        f"line {line}: {why}"
        for line, module, name in package_imports(script.read_text(encoding="utf-8"))
        if (why := unresolved(module, name)) is not None
    ]
    assert not errors, f"{script.relative_to(ROOT)} imports what the package no longer has:\n" + "\n".join(errors)


def test_package_imports_are_read_inside_functions() -> None:
    source = (
        "import os\n\ndef main():\n    from nest_integrations.index import NoSuchName\n    import nest_integrations.no_such_module\n"
        "    from nest_benchmarks.runner import no_such_function\n"
    )
    found = package_imports(source)
    assert found == [
        (4, "nest_integrations.index", "NoSuchName"),
        (5, "nest_integrations.no_such_module", None),
        (6, "nest_benchmarks.runner", "no_such_function"),
    ]
    assert [unresolved(module, name) is not None for _, module, name in found] == [True, True, True]


def cited_results_paths(source: str) -> list[tuple[int, str]]:
    """``(line, path)`` for every ``results/...`` path in the comments and docstrings (triple-quoted
    strings) of ``source``; a plain string such as a default output folder is not a citation."""
    cited: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        is_docstring = token.type == tokenize.STRING and token.string.lstrip("rRbBuU").startswith(('"""', "'''"))
        if token.type == tokenize.COMMENT or is_docstring:
            cited += [(token.start[0] + token.string[: m.start()].count("\n"), m.group()) for m in RESULTS_PATH.finditer(token.string)]
    return cited


def test_cited_results_paths_exist() -> None:
    missing = [
        f"{module.relative_to(ROOT)}:{line}: {path}"
        for folder in PACKAGE_DIRS
        for module in sorted(folder.rglob("*.py"))
        for line, path in cited_results_paths(module.read_text(encoding="utf-8"))
        if not (ROOT / path).exists()
    ]
    assert not missing, "cited results/ paths that are not in the repository:\n" + "\n".join(missing)


def test_citations_are_read_from_comments_and_docstrings_only() -> None:
    source = '''"""Measured (``results/a/bench.md``)."""\nOUT = Path("results/b")  # see results/c/\n'''
    assert cited_results_paths(source) == [(1, "results/a/bench.md"), (2, "results/c/")]
