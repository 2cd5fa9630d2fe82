"""Three back-to-back plain ``nest generate`` calls over the default index with the background
server on (``NEST_AUTO_SERVE`` unset): the first loads everything and starts ``nest serve``, the
next two are answered by it once it listens. Writes ``auto-serve.json`` and ``auto-serve.md`` here.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python results/startup/auto-serve/run.py`` from the repository
root. Sockets go to a fresh ``$XDG_RUNTIME_DIR`` (no server already running is used); the cache
(models, the default index) is the user's. The server is stopped at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from nest_integrations.cli.common import STARTUP_T0_ENV, STARTUP_TRACE_ENV, default_index_path
from nest_integrations.cli.server_transport import Connection, NoServer, default_socket_path, server_identity

PROMPT = "Tell me a bio of Marie Curie."
NEST = str(Path(sys.executable).with_name("nest"))
HERE = Path(__file__).resolve().parent


def call(env: dict[str, str], trace: Path) -> dict:
    """One ``nest generate PROMPT --json``: first token and end (s since the process started), wall, served or not."""
    trace.unlink(missing_ok=True)
    started = time.time()
    done = subprocess.run([NEST, "generate", PROMPT, "--json"], env={**env, STARTUP_T0_ENV: repr(started)}, capture_output=True, text=True)
    wall = time.time() - started
    if done.returncode:
        raise RuntimeError(done.stderr)
    marks, phases = (data := json.loads(trace.read_text()))["marks"], data["phases"]
    return {
        "started": started, "first_token": marks["first_token"], "total": wall, "served": "imports" not in phases,
        "text": json.loads(done.stdout)["text"], "stderr": done.stderr.strip(),
    }


def main() -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="nest-run-", dir="/tmp"))
    trace = run_dir / "trace.json"
    env = {k: v for k, v in os.environ.items() if k not in ("NEST_AUTO_SERVE", "NEST_SERVE_IDLE_S")}
    env.update(XDG_RUNTIME_DIR=str(run_dir), **{STARTUP_TRACE_ENV: str(trace)})
    os.environ["XDG_RUNTIME_DIR"] = str(run_dir)
    folder = default_index_path()
    identity = server_identity(folder, None)
    path = default_socket_path(identity)
    runs = [call(env, trace)]
    first_end = time.time()
    while True:  # ready: the server answers its handshake
        try:
            with Connection.open(path, identity) as connection:
                pid = connection.handshake["pid"]
            break
        except NoServer:
            if time.time() - first_end > 300:
                raise RuntimeError("the server did not listen within 300 s")
            time.sleep(0.1)
    ready = time.time()
    runs += [call(env, trace), call(env, trace)]
    subprocess.run([NEST, "serve", "--stop"], env=env, check=True, capture_output=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    load = os.getloadavg()[0]
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, load average {load:.1f} at the end",
        "index": str(folder), "server_pid": pid,
        "server_ready_after_first_start_s": ready - runs[0]["started"], "server_ready_after_first_exit_s": ready - first_end,
        "texts_equal": len({r["text"] for r in runs}) == 1,
        "runs": [{k: v for k, v in r.items() if k not in ("text", "started")} for r in runs],
    }
    (HERE / "auto-serve.json").write_text(json.dumps(result, indent=2) + "\n")
    rows = [
        f"| {n} | {'served' if r['served'] else 'loaded here, started the server'} | {r['first_token']:.2f} | {r['total']:.2f} |"
        for n, r in enumerate(result["runs"], 1)
    ]
    (HERE / "auto-serve.md").write_text("\n".join([
        "# Three plain `nest generate` calls, the background server on", "",
        f"{result['date']}, {result['machine']}. Command, three times: `nest generate {PROMPT!r} --json` "
        "(default index; the second once the server listened).", "",
        "| call | answered | first token (s) | total (s) |", "|---|---|---|---|", *rows, "",
        f"The server listened {result['server_ready_after_first_exit_s']:.2f} s after the first call exited "
        f"({result['server_ready_after_first_start_s']:.2f} s after it started). Texts equal: {'yes' if result['texts_equal'] else 'no'}.",
        "", "The first call's stderr: " + (f"`` {result['runs'][0]['stderr']} ``" if result["runs"][0]["stderr"] else "(empty)"), "",
    ]))
    print((HERE / "auto-serve.md").read_text())


if __name__ == "__main__":
    main()
