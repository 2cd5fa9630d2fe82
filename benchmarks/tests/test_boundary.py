"""The line between the library and the benchmarks project: the benchmarks use the library's
public names only, the library imports the benchmarks only where ``nest eval`` and ``nest bench``
run them, and the library's wheel ships none of the benchmarks' files."""

from __future__ import annotations

import ast
import importlib.util
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARK_SOURCES = sorted((ROOT / "benchmarks" / "nest_benchmarks").rglob("*.py"))
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "results").rglob("*.py"))
ENTRY_POINTS = {"nest_integrations/cli/evaluate.py", "nest_integrations/cli/bench.py"}
"""The library's only modules that import ``nest_benchmarks``, each inside the commands."""


def imports_of(nodes: Iterable[ast.AST], package: str) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every absolute import from ``package`` among ``nodes``: the module
    for ``import a.b``, ``module.name`` for each name of ``from module import name``."""
    found: list[tuple[int, str]] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == package]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == package:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def private_names(source: str) -> list[str]:
    """``line: name`` for each ``nest_integrations`` import in ``source`` that reaches a private
    module or name (a part with a leading underscore; dunders such as ``__version__`` are public)."""
    return [
        f"{line}: {name}"
        for line, name in imports_of(ast.walk(ast.parse(source)), "nest_integrations")
        if any(part.startswith("_") and not part.endswith("__") for part in name.split("."))
    ]


def test_the_private_name_check_sees_names_and_modules_in_functions_too():
    source = (
        "from nest_integrations import NestIndex\nfrom nest_integrations.langchain._common import x\n"
        "def f():\n    from nest_integrations.decoding.decoder import _gate\n    import nest_integrations.llama_index._common\n"
    )
    assert private_names(source) == [
        "2: nest_integrations.langchain._common.x",
        "4: nest_integrations.decoding.decoder._gate",
        "5: nest_integrations.llama_index._common",
    ]


@pytest.mark.parametrize("path", BENCHMARK_SOURCES + SCRIPTS, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_the_benchmarks_import_only_public_names_of_the_library(path):
    assert not private_names(path.read_text(encoding="utf-8")), f"{path.relative_to(ROOT)} imports private names of nest_integrations"


def run_on_import(tree: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``tree`` outside every function body: what runs when the module is imported."""
    for child in ast.iter_child_nodes(tree):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield child
            yield from run_on_import(child)


def test_the_library_imports_the_benchmarks_only_inside_nest_eval_and_nest_bench():
    importers, eager = set(), []
    for path in sorted((ROOT / "nest_integrations").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        relative = path.relative_to(ROOT).as_posix()
        if imports_of(ast.walk(tree), "nest_benchmarks"):
            importers.add(relative)
        eager += [f"{relative}:{line} {name}" for line, name in imports_of(run_on_import(tree), "nest_benchmarks")]
    assert importers == ENTRY_POINTS
    assert not eager, "imported when the module is, not when the command runs:\n" + "\n".join(eager)


def test_a_module_level_import_is_told_from_one_in_a_function():
    tree = ast.parse("import nest_benchmarks.runner\ndef run():\n    from nest_benchmarks.tasks import TASKS\n")
    assert imports_of(run_on_import(tree), "nest_benchmarks") == [(1, "nest_benchmarks.runner")]
    assert len(imports_of(ast.walk(tree), "nest_benchmarks")) == 2


def check_install():
    """``scripts/check_install.py`` as a module (importing it runs nothing)."""
    spec = importlib.util.spec_from_file_location("check_install", ROOT / "scripts" / "check_install.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_install_check_finds_benchmark_files_in_a_wheel(tmp_path):
    module = check_install()
    members = [
        "nest_integrations/__init__.py", "nest_integrations/corpus/markdown_structure.py",
        "nest_integrations/evaluation/runner.py", "nest_integrations/data/fastify-docs/Reference/Hooks.md",
        "nest_integrations/data/pino_qa.jsonl", "nest_benchmarks/tasks.py",
    ]
    assert module.benchmark_files(members) == members[2:]
    dist = tmp_path / "dist"
    dist.mkdir()
    with zipfile.ZipFile(dist / "nest_integrations-0.1.0-py3-none-any.whl", "w") as wheel:
        for name in members[:2]:
            wheel.writestr(name, "")
    module.check_wheel_files(dist)  # the library's own files pass
    with zipfile.ZipFile(dist / "nest_integrations-0.1.0-py3-none-any.whl", "a") as wheel:
        wheel.writestr(members[3], "")
    with pytest.raises(SystemExit, match="fastify-docs/Reference/Hooks.md"):
        module.check_wheel_files(dist)
