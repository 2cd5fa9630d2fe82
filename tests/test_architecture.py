"""The package's layers hold: the import contracts in ``.importlinter``, checked by import-linter."""

from __future__ import annotations

import ast
import configparser
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the package found in ``cwd`` (it puts ``cwd`` first on the path)."""
    assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} is missing: pip install -e '.[dev]' brings import-linter"
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", ".importlinter"],
        cwd=cwd, capture_output=True, text=True, timeout=300,
    )


def test_import_contracts_hold():
    """Layers, the integrations' independence and the absence of cycles (see ``.importlinter``)."""
    done = _lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


APPLICATIONS = {"cli", "evaluation", "langchain", "llama_index"}
"""The top layers; every other top-level module is core and must be listed as such."""


def test_every_module_has_a_layer():
    """A new top-level module is placed on purpose: in the core (``core-below-applications``)
    or as one of the applications, so the contracts cover it from its first commit."""
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter", encoding="utf-8")
    listed = config["importlinter:contract:core-below-applications"]["source_modules"].split()
    core = {name.removeprefix("nest_integrations.") for name in listed}
    present = {info.name for info in pkgutil.iter_modules([str(ROOT / "nest_integrations")]) if info.name != "__main__"}
    assert not core & APPLICATIONS
    assert present - APPLICATIONS == core, (
        f"not in .importlinter's core list: {sorted(present - APPLICATIONS - core)}; "
        f"listed but missing: {sorted(core - present)}"
    )


def test_an_upward_import_breaks_a_contract(tmp_path):
    """The check sees a lazy import inside a function too: the row scheduler reaching up
    to the decoder (the cycle the generation state's own module removed) fails it."""
    shutil.copytree(ROOT / "nest_integrations", tmp_path / "nest_integrations", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    batching = tmp_path / "nest_integrations" / "batching.py"
    batching.write_text(
        batching.read_text(encoding="utf-8") + "\n\ndef _decoder_type():\n    from .decoding import NestDecoder\n\n    return NestDecoder\n",
        encoding="utf-8",
    )
    done = _lint_imports(tmp_path)
    assert done.returncode != 0
    assert "nest_integrations.batching is not allowed to import nest_integrations.decoding" in done.stdout


def _private_imports(path: Path, module: str) -> list[str]:
    """``from <package module> import _name`` statements of ``path`` (module ``module``)."""
    found = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        if source.split(".")[0] != "nest_integrations":
            continue
        found += [f"{module}:{node.lineno} imports {source}.{a.name}" for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_private_name_is_imported_across_modules():
    """What one module uses of another is public (no leading underscore), so it is documented
    and renaming it is a visible change."""
    found = []
    for path in sorted((ROOT / "nest_integrations").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        found += _private_imports(path, module)
    assert not found, "\n".join(found)
