"""The library's shared test fixtures and helpers (``tests/conftest.py``: the SmolLM2 tokenizer, the
tiny random Llama, the small corpora) for the benchmarks' tests too.

That module is loaded once under a name of its own and its public names are re-exported here, so
pytest finds its fixtures for these tests and ``from conftest import make_tiny_lm`` reads the same
helper as in the library's tests. Nothing is copied: a fixture changed there changes here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

LIBRARY_CONFTEST = Path(__file__).resolve().parents[2] / "tests" / "conftest.py"
MODULE_NAME = "nest_integrations_tests_conftest"
"""Its name in ``sys.modules``: not ``conftest``, the name pytest gives each folder's own."""


def library_conftest() -> ModuleType:
    """``tests/conftest.py``, imported on the first call."""
    if MODULE_NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(MODULE_NAME, LIBRARY_CONFTEST)
        assert spec is not None and spec.loader is not None, f"no test fixtures at {LIBRARY_CONFTEST}"
        module = importlib.util.module_from_spec(spec)
        sys.modules[MODULE_NAME] = module
        spec.loader.exec_module(module)
    return sys.modules[MODULE_NAME]


globals().update({name: value for name, value in vars(library_conftest()).items() if not name.startswith("_")})
