"""Ends the Ray processes of a local cluster when the process that started it dies, even by SIGKILL.

``ray.init()`` without an address starts a cluster whose processes are
descendants of the driver. A clean exit shuts them down, and Ray ties the GCS
and the raylet to the driver, but after a ``kill -9`` of the driver Ray's
dashboard and runtime-env agents stay alive (two more per kill; they wait on the
dead GCS). :func:`start` launches a small watcher in its own session (so a
Ctrl-C to the driver's terminal does not end it first) that, every
:data:`POLL_S` seconds, records the driver's descendants that are Ray processes;
when the driver dies (or closes the watcher's pipe after ``ray.shutdown()``) it
kills the recorded ones still running. A process is identified by pid *and*
start time, so a reused pid is never touched. Only Ray processes descending from
the driver are recorded: a cluster the driver merely joined is left alone.

Linux only (it reads ``/proc``); elsewhere :func:`start` returns None. Standard
library only: it runs as ``python -m nest_integrations.index.ray_reaper <driver pid>``.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional

POLL_S = 0.5
"""Seconds between scans of the driver's descendants: Ray processes living less than this may be missed."""

RAY_PROCESS = re.compile(r"(^ray::|/ray/|\braylet\b|\bgcs_server\b)")
"""What a Ray process's command line shows: a worker or agent title (``ray::DashboardAgent``),
a script or binary inside the ``ray`` package (dashboard, monitor, raylet, gcs_server)."""


def _stat(pid: int) -> Optional[tuple[int, int]]:
    """``(parent pid, start time in clock ticks)`` of a live process, else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19])  # fields 4 and 22 of proc(5), counted after the command name


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def ray_descendants(root: int) -> dict[int, int]:
    """``{pid: start time}`` of the live descendants of ``root`` whose command line is a Ray process's."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            parents.setdefault(stat[0], []).append(int(entry.name))
    found: dict[int, int] = {}
    stack = list(parents.get(root, []))
    while stack:
        pid = stack.pop()
        stack.extend(parents.get(pid, []))
        stat = _stat(pid)
        if stat is not None and pid != os.getpid() and RAY_PROCESS.search(_cmdline(pid)):
            found[pid] = stat[1]
    return found


def watch(driver: int) -> None:
    """Record ``driver``'s Ray descendants until it dies or closes standard input, then kill them."""
    def start_time() -> Optional[int]:
        stat = _stat(driver)
        return stat[1] if stat is not None else None

    started = start_time()
    recorded: dict[int, int] = {}
    while started is not None and start_time() == started:
        recorded.update(ray_descendants(driver))
        readable, _, _ = select.select([sys.stdin], [], [], POLL_S)
        if readable and not os.read(sys.stdin.fileno(), 1):  # end of file: the driver is done or dead
            break
    for pid, start_time in recorded.items():
        stat = _stat(pid)
        if stat is not None and stat[1] == start_time:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def start() -> Optional[subprocess.Popen]:
    """Start a watcher of this process (see the module docstring); None off Linux.

    Close its ``stdin`` after ``ray.shutdown()`` and wait for it: it then kills
    what the shutdown left behind and exits.
    """
    if not sys.platform.startswith("linux"):
        return None
    return subprocess.Popen(
        [sys.executable, "-m", __name__, str(os.getpid())],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )


if __name__ == "__main__":
    watch(int(sys.argv[1]))
