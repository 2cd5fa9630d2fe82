"""Install the package as a user would, outside the checkout, and run a quick start there.

Run from anywhere with the development environment's Python (``.ci/run`` does, after
``make test``)::

    .venv/bin/python scripts/check_install.py

Four steps, each timed, the first failure ending the run with a non-zero status:

1. ``python -m build`` makes the sdist and the wheel into a temporary folder,
   ``twine check --strict`` reads their metadata (what PyPI would show), and the wheel is
   read for files of the benchmarks project (``benchmarks/``: the benches, the evaluation
   runner, the Fastify and Pino documents), which the library must not ship.
2. The ``bash`` block after ``<!-- install:venv -->`` in README.md runs as it is, from the
   repository root, in a new virtualenv in a temporary folder (activated with its
   ``bin/activate``). pip's own cache is used, so a second run downloads nothing.
3. From another temporary folder, with the hubs switched off (``HF_HUB_OFFLINE``) and an empty
   ``NEST_CACHE_DIR``: the installed package (not the checkout) builds a ``NestIndex`` over two
   tiny text files with the default LM and embedder and generates a few tokens, and the
   LangChain and LlamaIndex integrations embed with the bundled MiniLM.
4. ``nest --help`` runs from that folder.

``--keep`` leaves the temporary folder in place (its path is printed) to look into a failure;
``--wheel-only`` runs step 1's build and reads the wheel's files (seconds, no install).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MARKER = "<!-- install:venv -->"
_BLOCK_AFTER_MARKER = re.compile(re.escape(MARKER) + r"[ \t]*\n```bash\n(?P<code>.*?)\n```", re.DOTALL)

INSTALL_TIMEOUT_S = 45 * 60
"""The fresh install: about 2 minutes here from a warm pip cache (torch alone is ~190 MB)."""
STEP_TIMEOUT_S = 15 * 60
"""Any other step: the quick start converts the default LM once (~20 s) and loads it."""

QUICK_START = r'''
import sys
from pathlib import Path

import nest_integrations
from nest_integrations import NestIndex, load_corpus, load_lm
from nest_integrations.langchain import default_embeddings
from nest_integrations.llama_index import default_embed_model

repo = Path(sys.argv[1])
installed = Path(nest_integrations.__file__).resolve()
assert not installed.is_relative_to(repo), f"nest_integrations imported from the checkout: {installed}"
docs = Path("my_docs")
docs.mkdir()
(docs / "cache.txt").write_text(
    "quill keeps downloaded templates in ~/.cache/quill. Set QUILL_CACHE_DIR to override it for one run.\n"
)
(docs / "serve.md").write_text("# Preview\n\nquill serve starts a local preview server on port 8040.\n")
index = NestIndex.build(load_corpus("my_docs"), load_lm(), show_progress=False)
out = index.decoder().generate("Where does quill keep downloaded templates?", max_new_tokens=12)
assert out.text.strip(), "the default LM generated nothing"
assert len(default_embeddings().embed_query("quill cache")) == 384
assert len(default_embed_model().get_text_embedding("quill cache")) == 384
print(f"{installed.parent}: {index.lm.name} answered {out.text!r} (attribution {out.attribution_ratio:.2f})")
'''


BENCHMARK_FILE = re.compile(r"^(nest_integrations/evaluation|nest_benchmarks)/|fastify|pino", re.IGNORECASE)
"""A wheel member of the benchmarks project: its package (or the library's former
``evaluation`` folder) or another project's documents (Fastify's, Pino's)."""


def benchmark_files(members: Iterable[str]) -> list[str]:
    """The names among ``members`` (a wheel's, as ``zipfile`` lists them) that belong to the
    benchmarks project rather than the library (:data:`BENCHMARK_FILE`)."""
    return [name for name in members if BENCHMARK_FILE.search(name)]


def check_wheel_files(dist: Path) -> None:
    """The library's wheel in ``dist`` holds none of the benchmarks project's files.

    Raises:
        SystemExit: no wheel in ``dist``, or a benchmark file in it (the first few named).
    """
    print("== wheel files", flush=True)
    wheels = sorted(dist.glob("*.whl"))
    if not wheels:
        raise SystemExit(f"check_install: no wheel in {dist}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        members = wheel.namelist()
    if strays := benchmark_files(members):
        raise SystemExit(f"check_install: {wheels[0].name} ships {len(strays)} file(s) of the benchmarks project: {', '.join(strays[:5])}")
    print(f"== wheel files: {len(members)} in {wheels[0].name}, none of the benchmarks project", flush=True)


def install_block(readme_text: str) -> str:
    """The ``bash`` block that directly follows :data:`MARKER` in the README's text.

    Raises:
        ValueError: README.md has no marker, or no ``bash`` block right after it.
    """
    match = _BLOCK_AFTER_MARKER.search(readme_text)
    if match is None:
        raise ValueError(f"README.md: no ```bash block directly after {MARKER}")
    return match["code"]


def clean_env() -> dict[str, str]:
    """This process's environment without the checkout: no PYTHONPATH, PYTHONHOME or VIRTUAL_ENV,
    and no PATH entry inside the repository (its .venv/bin), so a command the new virtualenv
    lacks fails instead of running the development one."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    paths = [p for p in env.get("PATH", "").split(os.pathsep) if p and not Path(p).resolve().is_relative_to(REPO)]
    env["PATH"] = os.pathsep.join(paths)
    return env


def activated_env(venv: Path, **extra: str) -> dict[str, str]:
    """:func:`clean_env` as ``source venv/bin/activate`` leaves it, plus ``extra``."""
    env = clean_env()
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", **extra)
    return env


def step(name: str, argv: list[str], *, cwd: Path, timeout_s: float, env: dict[str, str] | None = None) -> float:
    """Run ``argv``, its output passing through; its wall time in seconds.

    Raises:
        SystemExit: the command failed or ran past ``timeout_s``, naming the step.
    """
    print(f"== {name}", flush=True)
    started = time.perf_counter()
    try:
        returncode = subprocess.run(argv, cwd=cwd, env=env, timeout=timeout_s, check=False).returncode
    except subprocess.TimeoutExpired:
        raise SystemExit(f"check_install: {name}: still running after {timeout_s:.0f} s") from None
    if returncode != 0:
        raise SystemExit(f"check_install: {name}: exit status {returncode}")
    elapsed = time.perf_counter() - started
    print(f"== {name}: {elapsed:.0f} s", flush=True)
    return elapsed


def check(work: Path) -> dict[str, float]:
    """The four steps in ``work`` (an empty folder outside the checkout); each step's seconds."""
    times: dict[str, float] = {}
    dist = work / "dist"
    times["build"] = step("build sdist and wheel", build_command(dist), cwd=work, timeout_s=STEP_TIMEOUT_S)
    artifacts = sorted(str(p) for p in dist.iterdir())
    times["twine"] = step("twine check", [sys.executable, "-m", "twine", "check", "--strict", *artifacts], cwd=work, timeout_s=STEP_TIMEOUT_S)
    check_wheel_files(dist)

    venv = work / "venv"
    times["venv"] = step("new virtualenv", [sys.executable, "-m", "venv", str(venv)], cwd=work, timeout_s=STEP_TIMEOUT_S)
    script = work / "install.sh"
    block = install_block(README.read_text(encoding="utf-8"))
    script.write_text(f"set -euo pipefail\nsource {venv / 'bin' / 'activate'}\nset -x\n{block}\n")
    times["install"] = step("README install block", ["bash", str(script)], cwd=REPO, env=clean_env(), timeout_s=INSTALL_TIMEOUT_S)

    run = work / "run"
    run.mkdir()
    offline = activated_env(venv, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", NEST_CACHE_DIR=str(work / "cache"))
    python = str(venv / "bin" / "python")
    times["quick start"] = step("quick start", [python, "-c", QUICK_START, str(REPO)], cwd=run, env=offline, timeout_s=STEP_TIMEOUT_S)
    times["nest --help"] = step("nest --help", [str(venv / "bin" / "nest"), "--help"], cwd=run, env=offline, timeout_s=STEP_TIMEOUT_S)
    return times


def build_command(dist: Path) -> list[str]:
    """``python -m build`` of the checkout into ``dist``: the sdist, then the wheel built from
    the sdist (so a stale ``build/`` folder in the checkout cannot leak into the wheel)."""
    return [sys.executable, "-m", "build", "--outdir", str(dist), str(REPO)]


def check_wheel(work: Path) -> dict[str, float]:
    """Step 1 without twine: the sdist and the wheel built into ``work``, the wheel's files
    checked (:func:`check_wheel_files`)."""
    dist = work / "dist"
    seconds = step("build sdist and wheel", build_command(dist), cwd=work, timeout_s=STEP_TIMEOUT_S)
    check_wheel_files(dist)
    return {"build": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="Leave the temporary folder in place.")
    parser.add_argument("--wheel-only", action="store_true", help="Only build the sdist and wheel and check the wheel's files.")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="nest-install-check-"))
    if work.resolve().is_relative_to(REPO):
        raise SystemExit(f"check_install: the temporary folder {work} is inside the checkout; set TMPDIR elsewhere")
    try:
        times = check_wheel(work) if args.wheel_only else check(work)
    finally:
        if args.keep:
            print(f"check_install: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("check_install: passed; " + ", ".join(f"{name} {s:.0f} s" for name, s in times.items()))


if __name__ == "__main__":
    main()
