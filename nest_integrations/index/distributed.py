"""Ray: build an index's embeddings and token keys on a cluster, and generate batches on one.

Two jobs, each run by Ray actors (one LM and one embedder per actor, loaded on
the worker from the same model name or path and checked against the driver's by
weight fingerprint, so a worker holding another model is an error):

* :func:`build_index_on_ray` splits the corpus into runs of ``shard_passages``
  passages; an actor embeds each run for the dense index and encodes its token
  keys, and writes them as one shard folder into the index being saved (layout
  in :mod:`nest_integrations.store.shards`). With a compressing key codec the driver
  first trains it on the keys of the first passages, as the single-process build
  does, and sends its arrays to the actors, which write coded shards. The driver
  builds the FAISS index from the shards' embeddings and writes the manifest
  (and the codec); loading memory-maps the shards as one datastore. The result
  equals a single-process build (see the tests).
* :func:`ray_generator` holds one actor per worker, each with the index loaded
  and a :class:`~nest_integrations.decoding.decoder.NestDecoder`; a chunk of prompts
  goes to a free actor, which runs the batched decoder on it
  (:mod:`nest_integrations.index.jobs` keeps the output in order and resumable).

Multi-node: every node needs the same nest-integrations and model files, and the
index folder must be on a file system every node sees at the same path (workers
write shards into it, and generation workers read it). Ray itself is an
optional dependency: ``pip install 'nest-integrations[ray]'``.

Every entry point connects through :func:`ray_cluster`, which fails within
``timeout_s`` (default :data:`DEFAULT_CONNECT_TIMEOUT_S`; CLI ``--ray-timeout``)
with a ValueError naming the address when no Ray cluster answers there, where
``ray.init`` alone retries for minutes. A local cluster started there ends with
the block, and with the process even when it is killed by SIGKILL
(:mod:`nest_integrations.index.ray_reaper`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

import numpy as np

from nest_integrations.core.config import NestConfig
from nest_integrations.corpus.passages import Passage
from nest_integrations.store.codec_base import DEFAULT_TRAIN_KEYS

if TYPE_CHECKING:  # pragma: no cover
    from nest_integrations.model.lm import LoadedLM
    from nest_integrations.store.codec_base import KeyCodec
    from .jobs import ChunkRunner
    from .nest_index import NestIndex

logger = logging.getLogger(__name__)

DEFAULT_SHARD_PASSAGES = 256
"""Passages per shard: the single-process precompute's chunk, so each shard is one encode call."""


def require_ray() -> Any:
    """The ``ray`` module.

    Raises:
        ImportError: Ray is not installed; the message names the extra.
    """
    try:
        import ray
    except ImportError as err:
        raise ImportError("Ray support needs the 'ray' extra: pip install 'nest-integrations[ray]'") from err
    return ray


DEFAULT_CONNECT_TIMEOUT_S = 20.0
"""Seconds to wait for a Ray cluster named by an address to answer before giving up."""


def _gcs_address(address: Optional[str]) -> Optional[tuple[str, int]]:
    """``(host, port)`` of the cluster ``address`` (or ``$RAY_ADDRESS`` when None) names, when it is
    ``HOST:PORT``; None for ``"auto"``, ``"local"``, ``ray://`` client addresses and no address."""
    address = address if address is not None else os.environ.get("RAY_ADDRESS")
    if not address or "://" in address:
        return None
    host, _, port = address.rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


def check_reachable(address: Optional[str], timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> None:
    """Fail within ``timeout_s`` when the Ray cluster at ``address`` cannot be reached.

    ``ray.init(address="HOST:PORT")`` retries for minutes when nothing answers
    there (or something other than Ray does), so before it this opens a TCP
    connection to the address, then asks the Ray GCS for its cluster id over
    gRPC, both within ``timeout_s`` in all. Addresses of other forms (``"auto"``,
    ``ray://``) are left to Ray, which resolves them quickly.

    Raises:
        ValueError: nothing listens at the address, or what listens is not a Ray
            cluster's GCS; the message names the address and what to do.
    """
    target = _gcs_address(address)
    if target is None:
        return
    where = f"{target[0]}:{target[1]}"
    deadline = time.monotonic() + timeout_s
    fix = "start one there with `ray start --head`, fix --ray-address / $RAY_ADDRESS, or leave both unset to start a local cluster"
    try:
        socket.create_connection(target, timeout=timeout_s).close()
    except OSError as err:
        raise ValueError(f"no Ray cluster answers at {where} ({err.strerror or err}); {fix}") from None
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return  # a TLS cluster needs Ray's certificates for gRPC: the TCP check above is all we do
    try:
        import grpc
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:  # a Ray without these modules: the TCP check above is all we can do
        return
    with grpc.insecure_channel(where) as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=max(0.1, deadline - time.monotonic())
            )
        except grpc.RpcError as err:
            if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED):
                raise ValueError(f"{where} answers, but not as a Ray cluster's GCS within {timeout_s:g} s ({err.code().name}); {fix}") from None
            # any other answer (e.g. authentication required) comes from a GCS: ray.init says more


@contextmanager
def ray_cluster(
    address: Optional[str] = None, *, num_cpus: Optional[int] = None, timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
) -> Iterator[Any]:
    """Use the Ray runtime already initialised in this process, or connect for the block.

    Args:
        address: a running cluster's ``HOST:PORT`` (as ``ray start --head``
            prints it) or ``"auto"``; None joins the cluster named by
            ``$RAY_ADDRESS`` or one started on this machine with ``ray start``,
            else starts a local one for the block.
        num_cpus: start a new local cluster of this many CPUs (with ``address``
            None), even if another one runs on this machine.
        timeout_s: how long a cluster named by ``HOST:PORT`` may take to answer
            (:func:`check_reachable`); larger tolerates a slow or distant head,
            smaller fails sooner on a wrong address.

    A connection made here is closed after the block; one made by the caller is
    left open. A local cluster started here ends with the block, and its
    processes are killed if this process dies first, even by SIGKILL
    (:mod:`nest_integrations.index.ray_reaper`, Linux).

    Raises:
        ValueError: the cluster at ``address`` does not answer within ``timeout_s``,
            or Ray cannot connect (e.g. ``"auto"`` with no cluster running).
        ImportError: Ray is not installed.
    """
    from . import ray_reaper

    ray = require_ray()
    if ray.is_initialized():
        yield ray
        return
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    if num_cpus is not None and address is None:
        address = "local"
    check_reachable(address, timeout_s)
    reaper = ray_reaper.start() if _gcs_address(address) is None else None  # this process may start the cluster
    try:
        try:
            ray.init(address=address, num_cpus=num_cpus if address == "local" else None, include_dashboard=False, log_to_driver=False)
        except ConnectionError as err:  # e.g. "auto" with no cluster running
            raise ValueError(f"cannot connect to a Ray cluster: {err}") from err
        try:
            yield ray
        finally:
            ray.shutdown()
    finally:
        if reaper is not None:
            reaper.stdin.close()  # the reaper kills what the shutdown left behind, then exits
            reaper.wait(timeout=10 * ray_reaper.POLL_S)


def _lm_source(lm: "LoadedLM") -> tuple[str, str]:
    """(name or path, dtype) to load ``lm`` again on a worker with :func:`~nest_integrations.model.lm.load_lm`."""
    from nest_integrations.model.lm import embedded_model

    name = lm.name
    if embedded_model(name) is None and not Path(name).exists() and "/" not in name:
        raise ValueError(
            f"workers load the LM by name or path, and {lm.name!r} is neither a folder nor a hub id; "
            "load it with load_lm(PATH) first"
        )
    return name, str(lm.model.dtype).removeprefix("torch.")


def _describe(lm: "LoadedLM") -> dict[str, str]:
    """What a worker tells the driver of its LM: name, weight and tokenizer fingerprints, host."""
    return {"name": lm.name, "fingerprint": lm.fingerprint(), "tokenizer": lm.tokenizer_fingerprint(), "host": socket.gethostname()}


def _same_lm_as(lm: "LoadedLM") -> Callable[[list[dict[str, str]]], None]:
    """A check raising ValueError when a worker's LM is not ``lm`` (weights or tokenizer)."""
    from nest_integrations.model.lm import fingerprints_match

    def check(workers: list[dict[str, str]]) -> None:
        for worker in workers:
            if not fingerprints_match(lm.fingerprint(), worker["fingerprint"]) or lm.tokenizer_fingerprint() != worker["tokenizer"]:
                raise ValueError(
                    f"the worker on {worker['host']} loaded {worker['name']!r} with fingerprint {worker['fingerprint']}, "
                    f"not the driver's LM {lm.name!r} ({lm.fingerprint()}): every node needs the same model files"
                )

    return check


def _last_error_line(message: str) -> str:
    """The ``SomeError: message`` line closing a Ray error's remote traceback (else all of it)."""
    lines = [line.strip() for line in message.splitlines() if "Error: " in line]
    return lines[-1] if lines else message


def _one_lm(workers: list[dict[str, Any]]) -> None:
    """Raise ValueError unless every worker holds the same LM, and decodes with the same config when they say."""
    first = workers[0]
    for other in workers[1:]:
        if (other["fingerprint"], other["tokenizer"]) != (first["fingerprint"], first["tokenizer"]):
            raise ValueError(f"the workers on {first['host']} and {other['host']} decode with different LMs")
        if other.get("config") != first.get("config"):
            raise ValueError(
                f"the workers on {first['host']} and {other['host']} decode with different settings (e.g. each fitted its "
                "own alpha/tau): run `nest calibrate` on the index first"
            )


class _BuildWorker:
    """A Ray actor: one LM (for keys), one embedder (for the dense index) and the key codec.

    ``codec`` is ``(spec, arrays)`` of the driver's trained codec
    (:meth:`~nest_integrations.store.codec_base.KeyCodec.arrays`); ``("float16", {})`` keeps float16 keys.
    """

    def __init__(
        self, model: str, dtype: str, embedder: Optional[str], key_layer: str, encoding_prefix: Optional[str],
        codec: tuple[str, dict[str, np.ndarray]],
    ):
        from nest_integrations.model.lm import load_lm
        from nest_integrations.store.encoder import PassageEncoder
        from nest_integrations.store.key_codec import codec_from_arrays

        self.lm = load_lm(model, device="cpu", dtype=dtype)
        self.encoder = PassageEncoder(self.lm, key_layer, encoding_prefix)
        self.codec = codec_from_arrays(codec[0], self.lm.hidden_size, codec[1])
        self.embedder_name = embedder
        self.embedder: Any = None  # loaded by the first shard, after the driver has checked the LM

    def _embedder(self) -> Any:
        from nest_integrations.retrieval.dense import load_embedder

        if self.embedder is None:
            self.embedder = load_embedder(self.embedder_name)
        return self.embedder

    def describe(self) -> dict[str, str]:
        return _describe(self.lm)

    def build_shard(self, folder: str, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Embed and encode the passages ``records`` (Passage dicts) into the shard folder ``folder``,
        keys stored with the codec."""
        from nest_integrations.retrieval.base import index_text
        from nest_integrations.retrieval.dense import embed_texts
        from nest_integrations.store.datastore import store_keys
        from nest_integrations.store.key_sources import PrecomputedKeys
        from nest_integrations.store.shards import write_shard

        start = time.perf_counter()
        passages = [Passage.from_dict(r) for r in records]
        encoded = [store_keys(e, self.codec) for e in self.encoder.encode([p.text for p in passages])]
        keys = PrecomputedKeys.from_encoded(encoded, self.encoder, self.codec)
        vectors = embed_texts(self._embedder(), [index_text(p) for p in passages])
        record = write_shard(Path(folder), keys, vectors)
        return {"record": record, "seconds": time.perf_counter() - start, "host": socket.gethostname()}


def _workers(ray: Any, cls: type, count: Optional[int], cpus_per_worker: float, *args: Any) -> list[Any]:
    """``count`` actors of ``cls`` (None: as many as the cluster's CPUs allow), each reserving ``cpus_per_worker``."""
    if cpus_per_worker <= 0:
        raise ValueError(f"cpus_per_worker must be positive, got {cpus_per_worker}")
    cpus = float(ray.cluster_resources().get("CPU", 0))
    if count is None:
        count = max(1, int(cpus // cpus_per_worker))
    if count < 1:
        raise ValueError(f"workers must be at least 1, got {count}")
    if count * cpus_per_worker > cpus:  # Ray would wait for CPUs that never come
        raise ValueError(f"{count} workers of {cpus_per_worker} CPUs need {count * cpus_per_worker:g} CPUs; the Ray cluster has {cpus:g}")
    actor = ray.remote(num_cpus=cpus_per_worker)(cls)
    return [actor.remote(*args) for _ in range(count)]


@contextmanager
def _actors(
    ray: Any, cls: type, count: Optional[int], cpus_per_worker: float, *args: Any,
    check: Callable[[list[dict[str, Any]]], None],
) -> Iterator[tuple[list[Any], list[dict[str, Any]]]]:
    """Start the actors, ``check`` what their ``describe()`` says of their LMs, yield the actors
    and those descriptions, and end them after the block (so a caller's long-lived Ray
    runtime gets its CPUs back)."""
    workers = _workers(ray, cls, count, cpus_per_worker, *args)
    try:
        try:
            described = ray.get([w.describe.remote() for w in workers])
        except ray.exceptions.RayActorError as err:  # the actor's __init__ raised: say what, not Ray's traceback
            raise ValueError(f"a Ray worker could not start: {_last_error_line(str(err))}") from err
        check(described)
        yield workers, described
    finally:
        for worker in workers:
            ray.kill(worker)


def build_index_on_ray(
    passages: Sequence[Passage],
    lm: "LoadedLM",
    out: str | os.PathLike[str],
    *,
    address: Optional[str] = None,
    workers: Optional[int] = None,
    cpus_per_worker: float = 1.0,
    shard_passages: int = DEFAULT_SHARD_PASSAGES,
    embedder: str | os.PathLike[str] | None = None,
    index_factory: str = "Flat",
    retriever_kind: str = "hybrid",
    key_layer: str = "ffn_input",
    encoding_prefix: Optional[str] = "auto",
    key_codec: "KeyCodec | str" = "float16",
    codec_train_keys: int = DEFAULT_TRAIN_KEYS,
    overwrite: bool = False,
    timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> "NestIndex":
    """Build and save a NEST index with precomputed keys, embedding and encoding on Ray actors.

    What :meth:`NestIndex.build(..., precompute_keys=True) <nest_integrations.index.nest_index.NestIndex.build>`
    followed by ``save(out)`` does in one process, with the keys in shards
    (:mod:`nest_integrations.store.shards`) written by the workers into the index being
    saved (atomically, as every save). Passages, token ids, spans, offsets and
    FAISS ids equal the single-process build's; keys and embeddings agree within
    float rounding (batches group passages differently, which changes summation
    order in the matrix kernels).

    Args:
        lm: the driver's LM; workers load it again by ``lm.name`` (the default
            alias, a local folder or a hub id available offline) in its dtype
            and must match its weight fingerprint.
        out: the index folder (visible to every node at this path).
        address: the Ray cluster (see :func:`ray_cluster`); ignored when Ray is
            already initialised in this process.
        workers: actors to start (None: cluster CPUs / ``cpus_per_worker``). Each
            holds a copy of the LM and the embedder (docs/ray.md has the
            defaults' memory).
        cpus_per_worker: CPUs each actor reserves (its torch threads).
        shard_passages: passages per shard and per task. Smaller balances load
            better across workers; larger means fewer files and less per-task
            overhead (each task pays Ray's scheduling; docs/ray.md).
        embedder: the embedder's folder or name (None: the bundled MiniLM);
            an embedder object cannot be sent to workers.
        key_codec: how the shards store keys, as in :meth:`NestIndex.build
            <nest_integrations.index.nest_index.NestIndex.build>`: ``"float16"``, ``"sq8"``,
            ``"pq<M>"``..., or a :class:`~nest_integrations.store.codec_base.KeyCodec`
            (a trained one is used as it is). An untrained codec is trained on
            the driver, on ``codec_train_keys`` entry keys of the first passages
            encoded in chunks of 256, as the single-process build trains it, so
            both builds get the same codec. The trade-off: the driver encodes
            those passages (about ``codec_train_keys`` tokens) before the
            workers start, and the workers encode them again; only the codec's
            arrays (kilobytes to a few MB) go to the workers.
        codec_train_keys: the codec's training sample, as in :meth:`NestIndex.build
            <nest_integrations.index.nest_index.NestIndex.build>`.
        overwrite: replace an index already at ``out``.
        timeout_s: how long the cluster at ``address`` may take to answer (:func:`ray_cluster`).

    Returns:
        The saved index, loaded from ``out`` (keys memory-mapped).

    Raises:
        ValueError: an empty corpus, bad settings (:func:`~nest_integrations.index.nest_index.check_build_options`),
            ``out`` not replaceable (all checked before any work), an unreachable cluster,
            or a worker whose LM differs.
        ImportError: Ray is not installed.
    """
    from nest_integrations.core.safe_io import atomic_folder, check_replaceable
    from nest_integrations.retrieval.dense import DenseRetriever
    from nest_integrations.store.datastore import train_on_first_passages
    from nest_integrations.store.encoder import PassageEncoder
    from nest_integrations.store.key_codec import resolve_codec
    from nest_integrations.store.shards import ShardedKeys, shard_name
    from .index_folder import FORMAT
    from .nest_index import NestIndex, check_build_options

    if not passages:
        raise ValueError("cannot build a NEST index over an empty corpus")
    if shard_passages < 1:
        raise ValueError(f"shard_passages must be at least 1, got {shard_passages}")
    if embedder is not None and not isinstance(embedder, (str, os.PathLike)):
        raise ValueError("a Ray build loads the embedder on each worker: pass its folder or name, not an object")
    check_build_options(
        len(passages), lm, index_factory=index_factory, retriever_kind=retriever_kind, key_layer=key_layer, key_codec=key_codec
    )
    check_replaceable(Path(out), FORMAT, overwrite=overwrite)  # before any work, not after
    model, dtype = _lm_source(lm)
    codec = resolve_codec(key_codec, lm.hidden_size)
    if not codec.is_trained:
        start = time.perf_counter()
        texts = [p.text for p in passages]
        train_on_first_passages(PassageEncoder(lm, key_layer, encoding_prefix), texts, codec, train_keys=codec_train_keys)
        logger.info("trained the %s key codec on the driver in %.1f s", codec.spec, time.perf_counter() - start)
    embedder_name = str(embedder) if embedder is not None else None
    records = [p.to_dict() for p in passages]
    runs = [records[lo : lo + shard_passages] for lo in range(0, len(records), shard_passages)]
    start = time.perf_counter()
    with ray_cluster(address, timeout_s=timeout_s) as ray, atomic_folder(out, kind=FORMAT, overwrite=overwrite) as tmp:
        keys_folder = tmp / "keys"
        keys_folder.mkdir()
        tasks = [(str(keys_folder / shard_name(n)), run) for n, run in enumerate(runs)]
        settings = (model, dtype, embedder_name, key_layer, encoding_prefix, (codec.spec, codec.arrays()))
        with _actors(ray, _BuildWorker, workers, cpus_per_worker, *settings, check=_same_lm_as(lm)) as (actors, _):
            pool = ray.util.ActorPool(actors)
            results = list(pool.map(lambda actor, task: actor.build_shard.remote(*task), tasks))
        logger.info(
            "built %d shards on %d workers (%s) in %.1f s", len(results), len(actors),
            ", ".join(sorted({r["host"] for r in results})), time.perf_counter() - start,
        )
        sharded = ShardedKeys.open(keys_folder, [r["record"] for r in results], codec=codec)
        vectors = np.concatenate(sharded.embeddings)
        dense = DenseRetriever.from_vectors(passages, vectors, embedder_name, index_factory=index_factory, show_progress=False)
        index = NestIndex(lm, passages, dense, retriever_kind=retriever_kind, key_layer=key_layer, encoding_prefix=encoding_prefix)
        index.datastore.attach_precomputed(sharded)
        index.write_into(tmp)
        del index, sharded, dense  # release the memory maps of the temporary before it is switched in
    return NestIndex.load(out, lm, embedder=embedder, verify_checksums=False)


class _GenerateWorker:
    """A Ray actor: the index loaded from its folder and a NestDecoder over it."""

    def __init__(self, index_path: str, model: Optional[str], overrides: dict[str, Any], max_batch: Optional[int]):
        from nest_integrations.model.lm import load_lm
        from .nest_index import NestIndex

        self.index = NestIndex.load(index_path, load_lm(model) if model else None)
        self.decoder = self.index.decoder()
        config = self.decoder.config.updated(**overrides)
        self.decoder.ensure_calibration(config)
        # The calibrated alpha/tau decide the outputs: they are pinned in the config the job records.
        alpha, tau = self.decoder.rrc_parameters(config)
        self.decoder.config = config.updated(alpha=alpha, tau=tau)
        self.max_batch = max_batch

    def describe(self) -> dict[str, Any]:
        """The LM (:func:`_describe`) and the decoding config, alpha and tau resolved, as JSON."""
        return {**_describe(self.index.lm), "config": self.decoder.config.model_dump(mode="json")}

    def generate(self, number: int, chunk: list[Any]) -> tuple[int, list[dict[str, Any]]]:
        from .jobs import generate_chunk

        return number, generate_chunk(self.decoder, chunk, max_batch=self.max_batch)


@dataclass(frozen=True)
class RayRunner:
    """A :data:`~nest_integrations.index.jobs.ChunkRunner` over Ray actors (call it with the chunks),
    the weight fingerprint of the LM every actor decodes with and their decoding config, alpha
    and tau resolved (the calibration's, as in-process), both for
    :func:`~nest_integrations.index.jobs.job_settings`: a resume after a recalibration is refused."""

    run: "ChunkRunner"
    lm_fingerprint: str
    config: NestConfig

    def __call__(self, chunks: Sequence[Sequence[Any]]) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        return self.run(chunks)


@contextmanager
def ray_generator(
    index_path: str | os.PathLike[str],
    *,
    model: Optional[str] = None,
    overrides: Optional[dict[str, Any]] = None,
    workers: Optional[int] = None,
    cpus_per_worker: float = 1.0,
    max_batch: Optional[int] = None,
) -> Iterator[RayRunner]:
    """Actors that each hold the index and a decoder, as a :class:`RayRunner`.

    Each chunk goes to the next free actor, which runs the batched decoder on
    it; chunks are yielded as they finish (:func:`~nest_integrations.index.jobs.run_job`
    puts them back in order). Each actor loads the index folder itself, so it
    must be visible on every node at ``index_path``; :meth:`NestIndex.load
    <nest_integrations.index.nest_index.NestIndex.load>` refuses an LM whose weights
    differ from those that built the keys, and the actors must agree on one LM.

    Args:
        index_path: the index folder.
        model: the LM to decode with (None: the one that built the index, when it is the default).
        overrides: :class:`~nest_integrations.core.config.NestConfig` fields, e.g.
            ``{"mode": "nest", "max_new_tokens": 64}``.
        workers: actors (None: cluster CPUs / ``cpus_per_worker``); each holds the LM,
            the embedder and the index's memory maps.
        cpus_per_worker: CPUs each actor reserves.
        max_batch: rows per batched forward inside an actor (None: the whole chunk).

    Use inside :func:`ray_cluster`; the actors end with the block.
    """
    ray = require_ray()
    args = (str(Path(index_path).resolve()), model, dict(overrides or {}), max_batch)
    with _actors(ray, _GenerateWorker, workers, cpus_per_worker, *args, check=_one_lm) as (actors, described):

        def run(chunks: Sequence[Sequence[Any]]) -> Iterator[tuple[int, list[dict[str, Any]]]]:
            pool = ray.util.ActorPool(actors)
            yield from pool.map_unordered(lambda actor, task: actor.generate.remote(*task), list(enumerate(map(list, chunks))))

        yield RayRunner(run, described[0]["fingerprint"], NestConfig.model_validate(described[0]["config"]))
