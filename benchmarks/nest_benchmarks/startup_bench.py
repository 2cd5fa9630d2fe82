"""How long ``nest generate`` takes to start (``nest bench startup``): each run a fresh process.

A one-shot command pays for everything before its first token: the interpreter and the
CLI's imports, the LM (importing torch and transformers, reading the converted weights),
the passage embedder (MiniLM, run through transformers), the index (passages, FAISS, BM25,
the LM's fingerprint checked against the manifest), then retrieval, the gate and the
encoding of the retrieved passages. :func:`run_startup_bench` runs
``python -m nest_integrations.cli generate PROMPT --json`` in fresh subprocesses over the
default index (``--datastore`` names it), with an empty temporary cache folder
(``$NEST_CACHE_DIR``):

* cold, first: the embedded LM is converted from its GGUF again and its fingerprint
  hashed again (the operating system's file cache stays as it is: warm);
* warm, ``runs`` times: everything those caches hold is read back;
* served, ``runs`` times (with ``served``): a ``nest serve`` of the index, started once and
  ready before the first of them, answers the command (``--server SOCKET``), which then imports
  neither torch nor transformers and loads nothing.

The cold and warm runs pass ``--server never``: a server the user keeps running is not timed.

Each process writes its phases through ``$NEST_STARTUP_TRACE``
(:class:`~nest_integrations.cli.common.StartupTrace`): ``startup`` (process start to the
command: interpreter and CLI imports), ``imports`` (torch, transformers and its model
classes), ``lm``, ``embedder``, ``index`` (the rest of the index load), ``first token``
(process start to the first generated token; served: to the first text chunk the server sent),
``exit`` (the command's end, its output written, to the process's exit, timed here) and
``total`` (process start to exit, timed here). The texts of all runs must be equal.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

from .runner import format_cell, markdown_table, write_json

__all__ = ["FIRST_TOKEN_GOAL_S", "run_startup_bench"]

FIRST_TOKEN_GOAL_S = 3.0
"""The goal checked: a warm ``nest generate`` reaches its first token within this many seconds."""

_COLUMNS = (("startup", "startup s"), ("imports", "torch + transformers s"), ("lm", "LM s"), ("embedder", "embedder s"), ("index", "index s"),
            ("first_token", "first token s"), ("exit", "exit s"), ("total", "total s"))


def _run_once(command: Sequence[str], env: Mapping[str, str], trace_file: Path, t0_variable: str) -> dict[str, Any]:
    """One fresh process: its phases (s), marks (s since its start), wall time and output."""
    trace_file.unlink(missing_ok=True)
    started = time.time()
    done = subprocess.run(list(command), env={**env, t0_variable: repr(started)}, capture_output=True, text=True)
    wall = time.time() - started
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    trace = json.loads(trace_file.read_text(encoding="utf-8"))
    marks, phases = trace["marks"], trace["phases"]
    output = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "startup": marks.get("command"), "imports": phases.get("imports"), "lm": phases.get("lm"), "embedder": phases.get("embedder"),
        "index": phases.get("index"), "generation": phases.get("generation"),
        "first_token": marks.get("first_token"), "exit": wall - marks["end"] if "end" in marks else None, "total": wall,
        "text": output["text"], "stderr": done.stderr.strip(),
    }


def _start_server(command: Sequence[str], env: Mapping[str, str], path: Path, timeout_s: float = 600.0) -> tuple["subprocess.Popen[str]", float]:
    """Start ``nest serve`` and wait until its socket at ``path`` takes a connection: the process
    and the seconds from its start to then (loading and its warm-up generation included)."""
    started = time.time()
    server = subprocess.Popen(list(command), env=dict(env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while time.time() - started < timeout_s:
        if server.poll() is not None:
            raise RuntimeError(f"{shlex.join(command)} failed ({server.returncode}): {server.communicate()[1].strip()[-2000:]}")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(path))
                return server, time.time() - started
            except OSError:
                time.sleep(0.1)
    _stop_server(server)
    raise RuntimeError(f"{shlex.join(command)} did not listen at {path} within {timeout_s:.0f} s")


def _stop_server(server: "subprocess.Popen[str]") -> None:
    """SIGTERM, as a user's Ctrl-C or service manager would; then wait for the exit."""
    server.send_signal(signal.SIGTERM)
    try:
        server.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.communicate()


def _median_row(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median of each column over ``runs``; None for a phase no run had (e.g. no bundled embedder)."""
    values = {key: [r[key] for r in runs if r[key] is not None] for key, _ in _COLUMNS}
    return {key: statistics.median(found) if found else None for key, found in values.items()}


def _markdown(bench: Mapping[str, Any]) -> str:
    rows = [[run["run"], *(run[key] for key, _ in _COLUMNS)] for run in bench["runs"] if not run["run"].startswith("served")]
    rows.append(["warm median", *(bench["warm_median"][key] for key, _ in _COLUMNS)])
    served = bench.get("served")
    if served:
        rows += [[run["run"], *(run[key] for key, _ in _COLUMNS)] for run in bench["runs"] if run["run"].startswith("served")]
        rows.append(["served median", *(served["median"][key] for key, _ in _COLUMNS)])
    goal = bench["goal"]
    served_lines = [
        f"- served: `{served['run_command']}` in a fresh process, answered by `{served['server_command']}`, started once "
        f"and listening {format_cell(served['ready_s'])} s after its start (loading and a one-token warm-up included).",
    ] if served else []
    served_goal = (
        f" Served first token <= {goal['first_token_s']:.1f} s: {'met' if goal['served_met'] else 'not met'} "
        f"({format_cell(served['median']['first_token'])} s; {served['speedup']:.1f}x sooner than warm)." if served else ""
    )
    return "\n".join([
        "# Start-up of `nest generate`",
        "",
        f"- date: {bench['date']}; command: `{bench['command']}`",
        f"- each run: `{bench['run_command']}` in a fresh process, {bench['machine']}",
        "- cold: the embedded LM converted from its GGUF and fingerprinted again; warm: both read from the cache.",
        *served_lines,
        "",
        markdown_table(["run", *(header for _, header in _COLUMNS)], rows),
        "",
        "startup: process start to the command (interpreter, CLI imports); torch + transformers: their imports; "
        "LM: load_lm (the model class, tokenizer, weights); embedder: the MiniLM (through transformers); index: the rest of the index "
        "load (passages, FAISS, BM25, fingerprint check); first token: process start to the first generated "
        "token; exit: the command's end (output written) to the process's exit; total: process start to exit.",
        "",
        f"Goal: warm first token <= {goal['first_token_s']:.1f} s: {'met' if goal['met'] else 'not met'} "
        f"({format_cell(bench['warm_median']['first_token'])} s).{served_goal} Texts equal across runs: {'yes' if bench['texts_equal'] else 'no'}.",
        "",
    ])


def run_startup_bench(
    *, prompt: str, runs: int = 3, max_new_tokens: int = 128, cold: bool = True, served: bool = False, out_dir: Path,
    index_folder: Path, trace_variables: tuple[str, str],
) -> dict[str, Any]:
    """Time ``nest generate`` from a fresh process, cold then ``runs`` times warm, then (``served``)
    ``runs`` times answered by a ``nest serve`` of the index (see the module).

    Args:
        index_folder: the index to generate over: the default index (generated over
            without ``--datastore``) or another one.
        trace_variables: the names of the environment variables the command reads its
            trace file and its start time from (the CLI's own, passed down: the CLI
            sits above this module).

    Writes ``startup.json`` and ``startup.md`` to ``out_dir`` and returns the former's content.

    Raises:
        ValueError: no index at ``index_folder``.
        RuntimeError: a run failed (its stderr in the message).
    """
    trace_variable, t0_variable = trace_variables
    folder = index_folder.resolve()
    if not (folder / "manifest.json").is_file():
        raise ValueError(f"no index at {folder}: build the default index first (nest demo)")
    cli = [sys.executable, "-m", "nest_integrations.cli"]
    command = [*cli, "generate", prompt, "--datastore", str(folder), "--json", "--max-new-tokens", str(max_new_tokens), "--server", "never"]
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="nest-startup-") as tmp:
        env = {**os.environ, "NEST_CACHE_DIR": str(Path(tmp) / "cache"), trace_variable: str(Path(tmp) / "trace.json")}
        if not cold:  # fill the temporary cache untimed
            _run_once(command, env, Path(tmp) / "trace.json", t0_variable)
        for number in range(runs + (1 if cold else 0)):
            result = _run_once(command, env, Path(tmp) / "trace.json", t0_variable)
            result["run"] = "cold" if cold and number == 0 else f"warm {number + (0 if cold else 1)}"
            results.append(result)
        if served:
            path = Path(tmp) / "serve.sock"
            server_command = [*cli, "serve", "--datastore", str(folder), "--socket", str(path)]
            served_command = [*command[:-1], str(path)]
            server, ready_s = _start_server(server_command, {k: v for k, v in env.items() if k != trace_variable}, path)
            try:
                for number in range(runs):
                    result = _run_once(served_command, env, Path(tmp) / "trace.json", t0_variable)
                    result["run"] = f"served {number + 1}"
                    results.append(result)
            finally:
                _stop_server(server)
    warm = [r for r in results if r["run"].startswith("warm")]
    median = _median_row(warm)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    bench = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "run_command": shlex.join(["nest", *command[3:]]),
        "machine": f"{os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        + (f"load average {load[0]:.1f} at the end" if load else "load average unknown"),
        "index": str(folder),
        "runs": [{k: v for k, v in r.items() if k not in ("text", "stderr")} for r in results],
        "warm_median": median,
        "texts_equal": len({r["text"] for r in results}) == 1,
        "goal": {"first_token_s": FIRST_TOKEN_GOAL_S, "met": median["first_token"] is not None and median["first_token"] <= FIRST_TOKEN_GOAL_S},
    }
    if served:
        served_median = _median_row([r for r in results if r["run"].startswith("served")])
        first = served_median["first_token"]
        bench["served"] = {
            "run_command": shlex.join(["nest", *served_command[3:]]), "server_command": shlex.join(["nest", *server_command[3:]]),
            "ready_s": ready_s, "median": served_median,
            "speedup": median["first_token"] / first if first and median["first_token"] else 0.0,
        }
        bench["goal"]["served_met"] = first is not None and first <= FIRST_TOKEN_GOAL_S
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "startup.json", bench)
    (out_dir / "startup.md").write_text(_markdown(bench), encoding="utf-8")
    return bench
