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


def test_every_module_has_a_layer():
    """A new top-level module or folder is placed on purpose, in a layer of the ``layers``
    contract, so the contracts cover it from its first commit."""
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter", encoding="utf-8")
    contract = config["importlinter:contract:layers"]
    assert contract["containers"].split() == ["nest_integrations"]
    placed = {name for name in contract["layers"].split() if name not in {"|", ":"}}
    present = {info.name for info in pkgutil.iter_modules([str(ROOT / "nest_integrations")]) if info.name != "__main__"}
    assert present == placed, f"in no layer: {sorted(present - placed)}; a layer but missing: {sorted(placed - present)}"


UPWARD_IMPORTS = {
    "decoding/batching.py": "from .decoder import NestDecoder",
    "store/datastore.py": "from nest_integrations.decoding.decoder import NestDecoder",
}
"""Imports the contracts refuse: inside a folder, the row scheduler reaching up to the decoder
(the cycle the generation state's own module removed); across folders, the token datastore."""


def test_an_upward_import_breaks_a_contract(tmp_path):
    """The check sees a lazy import inside a function too, inside a folder and across folders."""
    shutil.copytree(ROOT / "nest_integrations", tmp_path / "nest_integrations", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    for module, statement in UPWARD_IMPORTS.items():
        path = tmp_path / "nest_integrations" / module
        path.write_text(
            path.read_text(encoding="utf-8") + f"\n\ndef _decoder_type():\n    {statement}\n\n    return NestDecoder\n",
            encoding="utf-8",
        )
    done = _lint_imports(tmp_path)
    assert done.returncode != 0
    report = " ".join(done.stdout.split())  # the report wraps its long lines
    assert "nest_integrations.decoding.batching is not allowed to import nest_integrations.decoding.decoder" in report
    assert "nest_integrations.store is not allowed to import nest_integrations.decoding:" in report


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
