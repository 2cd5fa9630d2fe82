"""``nest generate`` (one prompt, or a resumable batch job) and ``nest demo``.

One prompt goes to a running ``nest serve`` of the same index and LM when one answers
(:mod:`.server_transport`): the command then prints what it would have printed itself without importing
torch or transformers, and otherwise loads everything here -- and then, having answered, starts
such a server in the background for the next command, stopping after ``$NEST_SERVE_IDLE_S``
idle (as a build tool's daemon does; ``NEST_AUTO_SERVE=0`` or ``--server never`` opt out).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import typer

from nest_integrations.index.distributed import DEFAULT_CONNECT_TIMEOUT_S
from .common import build_default_index, console, default_index_path, fail, given, load_index, positive, setup_logging, trace

logger = logging.getLogger(__name__)

app = typer.Typer()
"""The commands of this module, merged into ``nest``."""

AUTO_SERVE_ENV = "NEST_AUTO_SERVE"
"""Environment variable: ``0`` (or ``no``, ``false``, ``off``) and ``nest generate`` starts no
server after answering one prompt itself; anything else, or unset, and it does."""

SERVE_IDLE_ENV = "NEST_SERVE_IDLE_S"
"""Environment variable: seconds a server ``nest generate`` started waits idle before it stops
(``0`` or ``none``: it never stops by itself); default :data:`DEFAULT_SERVE_IDLE_S`."""

DEFAULT_SERVE_IDLE_S = 900.0
"""How long a server ``nest generate`` started stays loaded without a request: long enough for
a session of questions, short enough that a forgotten one gives its memory back."""


def _print_output(output: Any, title: str) -> None:
    from rich.panel import Panel

    from nest_integrations.decoding.rendering import render_terminal

    s = output.stats
    console.print(Panel(render_terminal(output), title=title))
    console.print(
        f"  attribution {output.attribution_ratio:.0%} · mean copied span {output.mean_copied_span_tokens:.1f} tokens · "
        f"{s.new_tokens} tokens in {s.forward_passes} forward passes · {s.wall_s:.2f} s "
        f"(calibration {s.calibration_s:.2f}, retrieval {s.retrieval_s:.2f}, encoding {s.encode_s:.2f}, decoding {s.decode_s:.2f})"
        + (f" · loading {s.load_s:.2f} s before" if s.load_s else ""),
        style="dim",
    )
    reason = getattr(s, "fallback_reason", None)
    if s.finish_reason == "not_covered":
        console.print(f"  No retrieved passage answers this ({reason.replace('_', ' ')}): nothing copied, nothing invented", style="yellow")
    elif reason is not None and output.mode != "base":
        console.print(f"  NEST copied nothing and generated with the LM alone: {reason.replace('_', ' ')}", style="yellow")


@app.command()
def generate(
    ctx: typer.Context,
    prompt: Optional[str] = typer.Argument(None, help="The prompt (omit with --input)."),
    datastore: Optional[Path] = typer.Option(None, "--datastore", "-d", help="Index folder (default: the demo index)."),
    query: Optional[str] = typer.Option(None, help="First-stage retrieval query (default: the prompt)."),
    mode: str = typer.Option("nest", help="base, rag, knnlm, nest or ra_nest."),
    max_new_tokens: int = typer.Option(256, min=1, help="Tokens to generate at most (as nest chat)."),
    as_json: bool = typer.Option(
        False, "--json", help="Print the output contract as one compact JSON line (append answers to a .jsonl file)."
    ),
    pretty: bool = typer.Option(False, "--pretty", help="With --json: indent the JSON for reading instead."),
    input_path: Optional[Path] = typer.Option(
        None, "--input", help="JSONL of {id?, prompt, query?} or {id?, messages: [{role, content}, ...], query?} to generate for."
    ),
    output_path: Optional[Path] = typer.Option(
        None, "--output", help="JSONL to write (with --input), in input order; a killed run resumes, keeping the items done."
    ),
    restart: bool = typer.Option(
        False, "--restart", help="With --input: replace --output (the output of an earlier job, never another file) "
        "instead of resuming it; a resume needs the same index, LM and decoding settings.",
    ),
    batch_size: int = typer.Option(8, min=1, help="With --input: items per batched-decoder call (and per Ray task)."),
    use_ray: bool = typer.Option(False, "--ray", help="With --input: spread the items over Ray workers, each holding the index."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster HOST:PORT (implies --ray)."),
    workers: Optional[int] = typer.Option(None, min=1, help="Ray workers (default: cluster CPUs / --cpus-per-worker)."),
    cpus_per_worker: float = typer.Option(1.0, callback=positive, help="CPUs each Ray worker reserves."),
    ray_timeout: float = typer.Option(
        DEFAULT_CONNECT_TIMEOUT_S, callback=positive, help="Seconds a Ray cluster at --ray-address may take to answer before the command fails.",
    ),
    model: Optional[str] = typer.Option(None, help="LM to decode with (default: the one that built the index)."),
    qdrant_path: Optional[Path] = typer.Option(
        None, "--qdrant-path", help="First stage from a local Qdrant folder instead of an index (with --collection; "
        "passages are encoded lazily when retrieved; nest index to-qdrant writes one).",
    ),
    collection: Optional[str] = typer.Option(None, help="Qdrant collection (with --qdrant-path)."),
    server: str = typer.Option(
        "auto", "--server", help="auto: answer one PROMPT through a running `nest serve` of this index and LM when one "
        "answers, else load everything here, then start one in the background for the next command (stops after $NEST_SERVE_IDLE_S, "
        "default 900, idle; NEST_AUTO_SERVE=0: start none); never: always here; a socket PATH: through that server (an error if it does not answer).",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Generate with attribution; one prompt, or a batch from --input to --output. One prompt is
    answered by a running `nest serve` of the same index and LM when there is one, else here,
    after which such a server is started in the background for the next prompt."""
    trace.mark("command")
    from nest_integrations.core.config import MODES, NestConfig

    if verbose:  # else keep what `nest -v` set
        setup_logging(True)
    if mode not in MODES:
        fail(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    try:
        NestConfig().updated(mode=mode, max_new_tokens=max_new_tokens)
    except ValueError as err:
        fail(str(err))
    if (prompt is None) == (input_path is None):
        fail("give either a PROMPT or --input FILE")
    if input_path is not None and output_path is None:
        fail("--input needs --output")
    if input_path is None and (stray := given(ctx, "output_path", "restart", "batch_size")):
        fail(f"{', '.join(stray)} apply with --input only")
    if pretty and not as_json:
        fail("--pretty formats --json; add --json")
    if input_path is not None and (stray := given(ctx, "query", "as_json", "pretty", "server")):
        fail(f"{', '.join(stray)} apply to one PROMPT; with --input each item has its own query, and outputs go to --output")
    if (qdrant_path is None) != (collection is None):
        fail("--qdrant-path and --collection go together")
    if qdrant_path is not None and (datastore is not None or input_path is not None):
        fail("--qdrant-path generates for one PROMPT, without --datastore or --input")
    if qdrant_path is not None and (stray := given(ctx, "server")):
        fail(f"{', '.join(stray)} serves an index; --qdrant-path generates here")
    use_ray = use_ray or ray_address is not None
    if use_ray and input_path is None:
        fail("--ray needs --input")
    if not use_ray and (stray := given(ctx, "workers", "cpus_per_worker", "ray_timeout")):
        fail(f"{', '.join(stray)} apply with --ray only")
    if input_path is not None:
        assert output_path is not None
        _generate_items(
            input_path, output_path, datastore, model=model, overrides={"mode": mode, "max_new_tokens": max_new_tokens},
            batch_size=batch_size, restart=restart, ray=(use_ray, ray_address, workers, cpus_per_worker, ray_timeout),
        )
        return
    if qdrant_path is None and server != "never":
        assert prompt is not None
        served = _served_output(server, datastore, model, prompt, query, {"mode": mode, "max_new_tokens": max_new_tokens})
        if served is not None:
            if as_json:
                sys.stdout.write(_json_line(served, pretty))
            else:
                from nest_integrations.decoding.output import NestOutput

                _print_output(NestOutput.model_validate(served), mode)
            trace.write()
            return
    loading = time.perf_counter()
    try:
        decoder = _qdrant_decoder(qdrant_path, collection, model) if qdrant_path is not None else load_index(datastore, model).decoder()
        decoder.config = decoder.config.updated(mode=mode, max_new_tokens=max_new_tokens)
    except ValueError as err:
        fail(str(err))
    loaded_s = time.perf_counter() - loading
    output = _generate_one(decoder, prompt, query)
    output.stats.load_s = loaded_s
    if as_json:
        sys.stdout.write(_json_line(output.to_dict(), pretty))
    else:
        _print_output(output, f"{mode}")
    trace.write()
    if qdrant_path is None and server == "auto":
        sys.stdout.flush()  # the answer is out before the server's start is
        _serve_next_time(datastore, model)


def _serve_next_time(datastore: Optional[Path], model: Optional[str]) -> None:
    """Start a ``nest serve`` of the index and LM in the background for the next command, unless
    ``$NEST_AUTO_SERVE`` says not to or one holds the socket already, and say so on stderr."""
    from .server_transport import idle_timeout, start_server

    if os.environ.get(AUTO_SERVE_ENV, "").strip().lower() in ("0", "no", "false", "off"):
        return
    try:
        idle_s = idle_timeout(os.environ.get(SERVE_IDLE_ENV, f"{DEFAULT_SERVE_IDLE_S:g}"))
    except ValueError as err:
        logger.warning("$%s: %s; using %g s", SERVE_IDLE_ENV, err, DEFAULT_SERVE_IDLE_S)
        idle_s = DEFAULT_SERVE_IDLE_S
    try:
        if start_server(datastore or default_index_path(model), model, idle_s) is None:
            return
    except (OSError, ValueError) as err:  # the answer is printed: a server that cannot start costs nothing more
        logger.warning("could not start a server for the next questions: %s", err)
        return
    stop = " ".join(["nest serve --stop", *(["-d", str(datastore)] if datastore else []), *(["--model", model] if model else [])])
    lasts = "runs until stopped" if idle_s is None else f"stops after {idle_s / 60:g} min idle" if idle_s >= 60 else f"stops after {idle_s:g} s idle"
    sys.stderr.write(f"nest: a server now keeps this index loaded for the next questions ({lasts}; `{stop}` stops it now)\n")


def _json_line(output: dict[str, Any], pretty: bool) -> str:
    """What ``--json`` prints for ``output`` (the output contract as a dict): one compact line, or indented."""
    return json.dumps(output, ensure_ascii=False, **({"indent": 2} if pretty else {"separators": (",", ":")})) + "\n"


def _served_output(
    server: str, datastore: Optional[Path], model: Optional[str], prompt: str, query: Optional[str], options: dict[str, Any],
) -> Optional[dict[str, Any]]:
    """The output contract (a dict) of ``prompt`` as the ``nest serve`` of the index and LM answers
    it, or None when the command should generate itself.

    ``server``: ``auto`` (the server at the index's and LM's default socket in a run folder of
    this user's alone, when one of this user answers the handshake with what this command would
    load; a server that goes away or falls silent mid-answer is reported on stderr and the
    command generates itself, having printed nothing yet) or a socket path (any failure to answer
    fails the command). A request the server refuses fails the command, as it would fail here.
    """
    from .server_transport import Connection, NoServer, RequestRefused, UntrustedPath, default_socket_path, private_run_folder, server_identity

    auto = server == "auto"
    try:
        identity = server_identity(datastore or default_index_path(model), model)
    except ValueError as err:
        if auto:  # no index yet: loading says so, or builds the default one
            return None
        fail(str(err))
    path = default_socket_path(identity) if auto else Path(server)
    if auto and not path.exists():
        return None
    if auto:
        try:
            private_run_folder()
        except UntrustedPath as err:
            sys.stderr.write(f"nest: not using the server at {path}: {err}; generating here\n")
            return None
    try:
        connection = Connection.open(path, identity)
    except NoServer as err:  # a stale socket, another index build or LM: nothing to say unless asked for
        if not auto:
            fail(str(err))
        logger.info("%s; generating here", err)
        return None
    with connection, trace.phase("generation"):
        try:
            for message in connection.generate(prompt, query, options):
                if message.get("text"):
                    trace.mark("first_token")
                if "output" in message:
                    logger.info("answered by the server at %s (process %s)", path, connection.handshake.get("pid"))
                    return message["output"]
        except RequestRefused as err:
            fail(str(err))
        except NoServer as err:
            if not auto:
                fail(str(err))
            sys.stderr.write(f"nest: {err} (the server at {path}, process {connection.handshake.get('pid')}); generating here\n")
    return None


def _generate_one(decoder: Any, prompt: str, query: Optional[str]) -> Any:
    """``decoder.generate(prompt, query=query)``; under a start-up trace, the same generation
    streamed, to mark when its first token comes."""
    if not trace.active:
        return decoder.generate(prompt, query=query)
    output = None
    with trace.phase("generation"):
        for chunk in decoder.stream(prompt, query=query):
            if chunk.text:
                trace.mark("first_token")
            output = chunk.output
    return output


def _generate_items(
    input_path: Path, output_path: Path, datastore: Optional[Path], *, model: Optional[str], overrides: dict[str, Any],
    batch_size: int, restart: bool, ray: tuple[bool, Optional[str], Optional[int], float, float],
) -> None:
    """``nest generate --input``: a resumable job (:mod:`nest_integrations.index.jobs`), in this process or on Ray.

    The input and the output file are checked before the index or the LM is loaded; the
    settings a resume must share (index, LM, decoding) once they are."""
    from nest_integrations.index.jobs import in_process_runner, job_settings, output_lock, read_items, run_job
    from nest_integrations.index.nest_index import index_identity

    use_ray, address, workers, cpus_per_worker, timeout_s = ray
    folder = datastore or default_index_path()
    try:
        items = read_items(input_path)
        with output_lock(output_path):  # checked first; a second job on this output is refused
            if datastore is None and not (folder / "manifest.json").exists():
                build_default_index(folder)
            identity = index_identity(folder)
            if use_ray:
                from nest_integrations.index.distributed import ray_cluster, ray_generator

                with ray_cluster(address, timeout_s=timeout_s), ray_generator(
                    folder, model=model, overrides=overrides, workers=workers, cpus_per_worker=cpus_per_worker
                ) as ray_runner:
                    settings = job_settings(index=identity, lm_fingerprint=ray_runner.lm_fingerprint, config=ray_runner.config)
                    runner, tally = _tallied(ray_runner)
                    started = time.perf_counter()
                    generated = run_job(items, output_path, runner, settings=settings, chunk_size=batch_size, restart=restart)
                    tally.wall_s = time.perf_counter() - started
            else:
                decoder = load_index(folder, model).decoder()
                decoder.config = decoder.config.updated(**overrides)
                decoder.ensure_calibration(decoder.config)
                # The calibrated alpha/tau decide the outputs too: a resume after `nest calibrate` is refused.
                alpha, tau = decoder.rrc_parameters(decoder.config)
                settings = job_settings(index=identity, lm_fingerprint=decoder.lm.fingerprint(), config=decoder.config.updated(alpha=alpha, tau=tau))
                runner, tally = _tallied(in_process_runner(decoder))
                started = time.perf_counter()
                generated = run_job(items, output_path, runner, settings=settings, chunk_size=batch_size, restart=restart)
                tally.wall_s = time.perf_counter() - started
    except (ValueError, ImportError) as err:
        fail(str(err))
    kept = len(items) - generated
    console.print(f"Wrote {len(items)} generations to {output_path}" + (f" ({kept} kept from an earlier run)" if kept else ""))
    if generated:
        sys.stderr.write(tally.summary() + "\n")


@dataclass
class _BatchTally:
    """What a batch job generated now: items, tokens and their own wall times (``stats.wall_s``)."""

    items: int = 0
    new_tokens: int = 0
    item_wall_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    """The job's generation time (loading excluded), set once it ends."""

    def add(self, outputs: list[dict[str, Any]]) -> None:
        for out in outputs:
            self.items += 1
            self.new_tokens += int(out["stats"]["new_tokens"])
            self.item_wall_s.append(float(out["stats"]["wall_s"]))

    def summary(self) -> str:
        """One line: ``batch: N items, T tokens in W s (R tokens/s); item wall mean M s, max X s``."""
        rate = self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0
        walls = self.item_wall_s or [0.0]
        return (
            f"batch: {self.items} items, {self.new_tokens} tokens in {self.wall_s:.2f} s ({rate:.1f} tokens/s); "
            f"item wall mean {sum(walls) / len(walls):.2f} s, max {max(walls):.2f} s"
        )


def _tallied(runner: Any) -> tuple[Any, _BatchTally]:
    """``runner`` (a :data:`~nest_integrations.index.jobs.ChunkRunner`) counting what it generates into a tally."""
    tally = _BatchTally()

    def run(chunks: Any) -> Any:
        for number, outputs in runner(chunks):
            tally.add(outputs)
            yield number, outputs

    return run, tally


def _qdrant_decoder(path: Path, collection: Optional[str], model: Optional[str]) -> Any:
    """A decoder whose first stage is a local Qdrant collection (lazy token datastore)."""
    from nest_integrations.model.lm import load_lm
    from nest_integrations.index.foreign_store import store_decoder

    try:  # the qdrant extra (and LangChain) may be missing: a clear message, not a traceback
        from nest_integrations.langchain import LangChainVectorStoreRetriever, open_qdrant

        retriever = LangChainVectorStoreRetriever(open_qdrant(path, str(collection)))
    except ImportError as err:
        fail(str(err))
    return store_decoder(retriever, load_lm(model or "default"))


DEMO_WARMUP = ("Tell me a bio of Alan Turing.", "Alan Turing")
"""The warm-up question of ``nest demo`` (prompt, query): another person than the compared one, so
the compared question still retrieves and encodes its own passages."""


@app.command()
def demo(
    prompt: str = typer.Option("Tell me a bio of Ada Lovelace.", help="The prompt."),
    query: str = typer.Option("Ada Lovelace", help="First-stage retrieval query."),
    max_new_tokens: int = typer.Option(96, min=1, help="Tokens to generate."),
) -> None:
    """Build (once) the default index over the Wikipedia summaries and compare NEST with the base LM.

    What a process pays once -- building the index (first run), loading the index and the LM,
    and a warm-up question in each mode (the first forward's set-up, a calibration the index
    lacks) -- is timed and shown apart; the two answers compared are timed after it, this
    question's retrieval and passage encoding included. So the first run on a fresh cache
    prints the same comparison as the next ones."""
    costs = _demo_one_time_costs()
    index, costs["loading the index and LM"] = _timed(lambda: load_index(None))
    decoder = index.decoder()
    warmups, costs["warm-up (another question, both modes)"] = _timed(
        lambda: [decoder.generate(DEMO_WARMUP[0], query=DEMO_WARMUP[1], mode=mode, max_new_tokens=8) for mode in ("base", "nest")]
    )
    calibrated_s = sum(output.stats.calibration_s for output in warmups)
    outputs = {mode: decoder.generate(prompt, query=query, mode=mode, max_new_tokens=max_new_tokens) for mode in ("base", "nest")}
    shown = ", ".join(f"{what} {seconds:.1f} s" for what, seconds in costs.items())
    console.print(f"[dim]One-time costs, not in the comparison: {shown}" + (f" (calibration {calibrated_s:.1f} s)" if calibrated_s else "") + "[/dim]")
    console.print(f"[bold]Prompt:[/bold] {prompt}   [dim](retrieval query: {query})[/dim]")
    for mode, output in outputs.items():
        _print_output(output, "NEST (copied spans highlighted, sources numbered)" if mode == "nest" else "base LM")
    base, nest = outputs["base"].stats, outputs["nest"].stats
    if nest.wall_s > 0 and base.new_tokens and nest.new_tokens:
        speed = (base.wall_s / base.new_tokens) / (nest.wall_s / nest.new_tokens)
        console.print(f"NEST: {speed:.1f}x the base LM's tokens per second on this prompt (retrieval and encoding included).")


def _demo_one_time_costs() -> dict[str, float]:
    """Seconds of the one-time costs ``nest demo`` has paid so far, by what they were: building the
    default index when the cache has none (nothing otherwise)."""
    folder = default_index_path()
    if (folder / "manifest.json").exists():
        return {}
    _, seconds = _timed(lambda: build_default_index(folder))
    return {"building the index (once)": seconds}


def _timed(run: Any) -> tuple[Any, float]:
    """``run()``'s result and its wall time in seconds."""
    started = time.perf_counter()
    result = run()
    return result, time.perf_counter() - started
