"""Ray: a build on a local two-CPU cluster equals the single-process build, with float16 keys
and with coded keys (sq8, pq8); batch generation on Ray keeps the input order and equals the
in-process run.

One local cluster (``ray.init(num_cpus=2)``) serves the whole module. The LM is
the tiny random Llama, saved to a folder so that workers load it by path.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from nest_integrations.cli import app
from nest_integrations.corpus.loaders import load_corpus, load_wikipedia_summaries
from nest_integrations.corpus.passages import save_passages_jsonl
from nest_integrations.index.nest_index import NestIndex
from nest_integrations.model.lm import load_lm
from nest_integrations.store.key_precision import encoding_dtype

from conftest import make_tiny_lm

ray = pytest.importorskip("ray")

from nest_integrations.index.distributed import build_index_on_ray  # noqa: E402  (needs ray)

QUERIES = ["a painter born in Italy", "a scientist who studied physics", "an American politician"]


@pytest.fixture(scope="module")
def cluster():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # never a cluster already running here
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def tiny_path(smol_tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    lm = make_tiny_lm(smol_tokenizer)
    lm.model.save_pretrained(folder)
    smol_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def path_lm(tiny_path):
    return load_lm(str(tiny_path), device="cpu")


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "people.jsonl"
    save_passages_jsonl(load_wikipedia_summaries(topic="People", limit=10), path)
    return path


@pytest.fixture(scope="module")
def corpus(corpus_file):
    return load_corpus(str(corpus_file))


@pytest.fixture(scope="module")
def single(corpus, path_lm):
    return NestIndex.build(corpus, path_lm, precompute_keys=True, show_progress=False)


def build_with_cli(corpus_file, tiny_path, out, *options: str) -> None:
    """``nest index build --ray`` (which calls :func:`build_index_on_ray`), two workers, shards of 4 passages."""
    result = CliRunner().invoke(app, [
        "index", "build", str(corpus_file), "--out", str(out), "--model", str(tiny_path), "--max-tokens", "0",
        "--ray", "--workers", "2", "--shard-passages", "4", *options,
    ])
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def on_ray(cluster, corpus_file, tiny_path, path_lm, tmp_path_factory):
    out = tmp_path_factory.mktemp("built") / "index"
    build_with_cli(corpus_file, tiny_path, out)
    return NestIndex.load(out, path_lm), out


def test_ray_build_equals_the_single_process_build(single, on_ray, corpus):
    index, out = on_ray
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["passages"] for s in manifest["key_shards"]] == [4, 4, 2]
    assert [p.to_dict() for p in index.passages] == [p.to_dict() for p in corpus]
    a, b = single.datastore.precomputed, index.datastore.precomputed
    assert (a.num_tokens, a.num_entries) == (b.num_tokens, b.num_entries)
    for i in range(len(corpus)):
        x, y = a.passage(i), b.passage(i)
        assert np.array_equal(x.token_ids, y.token_ids) and np.array_equal(x.char_spans, y.char_spans)
        assert np.array_equal(x.valid, y.valid)
        # Not always bitwise: shards of 4 batch other passages together than the one-process build
        # (chunks of 256), so the kernels may sum in another order and a key move by a rounding step
        # of the precision it was encoded in: float16's for float32 encoding, a bfloat16 step or two
        # where keys are encoded in bfloat16 (key_precision). With shards of 256 the batches, and
        # the keys, are the same.
        step = 2.0**-6 if encoding_dtype(single.lm) == torch.bfloat16 else 2e-3
        np.testing.assert_allclose(x.keys.astype(np.float32), y.keys.astype(np.float32), rtol=step, atol=step)
    np.testing.assert_allclose(index.dense.passage_vectors(corpus), single.dense.passage_vectors(corpus), atol=1e-5)
    for query in QUERIES:
        got, want = index.retrieve(query, 5), single.retrieve(query, 5)
        assert [p.id for p, _ in got] == [p.id for p, _ in want]
        np.testing.assert_allclose([s for _, s in got], [s for _, s in want], atol=1e-5)


@pytest.fixture(scope="module", params=["sq8", "pq8"])
def coded(request, cluster, corpus, corpus_file, tiny_path, path_lm, tmp_path_factory):
    """(codec, the single-process coded build, the coded Ray build loaded, its folder): sq8 through
    ``nest index build --ray --key-compression``, pq8 through :func:`build_index_on_ray`; shards of
    4 passages on two workers, as ``on_ray``."""
    codec = request.param
    out = tmp_path_factory.mktemp(f"built-{codec}") / "index"
    if codec == "sq8":
        build_with_cli(corpus_file, tiny_path, out, "--key-compression", codec)
    else:
        build_index_on_ray(corpus, path_lm, out, workers=2, shard_passages=4, key_codec=codec)
    local = NestIndex.build(corpus, path_lm, precompute_keys=True, show_progress=False, key_codec=codec)
    return codec, local, NestIndex.load(out, path_lm), out


def test_a_coded_ray_build_equals_the_coded_single_process_build(coded, single, on_ray, corpus):
    codec, local, index, out = coded
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["key_codec"] == codec and [s["passages"] for s in manifest["key_shards"]] == [4, 4, 2]
    assert any(rel.startswith("keys/codec/") for rel in manifest["checksums"])
    a, b = local.datastore.precomputed, index.datastore.precomputed
    assert a.codec.spec == b.codec.spec == codec
    # The driver encodes the first passages in the chunks the single-process build uses, so both train
    # the same codec from the same sample.
    for name, array in a.codec.arrays().items():
        np.testing.assert_array_equal(array, b.codec.arrays()[name])
    assert (a.num_tokens, a.num_entries) == (b.num_tokens, b.num_entries)
    float_local, float_ray = single.datastore.precomputed, on_ray[0].datastore.precomputed
    compared = 0
    for i in range(len(corpus)):
        x, y = a.passage(i), b.passage(i)
        assert np.array_equal(x.token_ids, y.token_ids) and np.array_equal(x.valid, y.valid)
        assert x.keys.dtype == y.keys.dtype == np.uint8
        # Codes are a function of the float16 keys and the (equal) codec. The float16 keys of the two
        # builds agree within a rounding step, not bitwise (shards batch other passages together; see
        # test_ray_build_equals_the_single_process_build), and a key a rounding step away may fall into
        # the next sq8 bucket or, near a boundary, the next PQ centroid. So: the codes are the same on
        # every row whose float16 keys are the same in both float16 builds, and sq8 codes move by at
        # most one step on the others.
        same_keys = (float_local.passage(i).keys == float_ray.passage(i).keys).all(axis=1)
        assert np.array_equal(x.keys[same_keys], y.keys[same_keys])
        compared += int(same_keys.sum())
        if codec == "sq8":
            assert np.abs(x.keys.astype(np.int16) - y.keys.astype(np.int16)).max(initial=0) <= 1
    assert compared > 0  # the rows compared code for code
    for query in QUERIES:
        got, want = index.retrieve(query, 5), local.retrieve(query, 5)
        assert [p.id for p, _ in got] == [p.id for p, _ in want]
    # The shards are searched as one datastore: the same top-5 entries over every passage.
    queries = torch.randn(4, a.codec.dim, generator=torch.Generator().manual_seed(0))
    everything = list(range(len(corpus)))
    got, want = index.datastore.candidates(everything).search(queries, 5), local.datastore.candidates(everything).search(queries, 5)
    assert torch.equal(got.entries, want.entries)


def test_a_coded_sharded_index_saves_again_and_loads_memory_mapped(coded, path_lm, tmp_path):
    codec, _, index, _ = coded
    again = NestIndex.load(index.save(tmp_path / "copy"), path_lm)
    keys = again.datastore.precomputed
    assert isinstance(keys.segments[0].keys, np.memmap) and keys.codec.spec == codec
    for name, array in index.datastore.precomputed.codec.arrays().items():
        np.testing.assert_array_equal(array, keys.codec.arrays()[name])
    assert np.array_equal(keys.passage(9).keys, index.datastore.precomputed.passage(9).keys)
    assert again.info()["key_codec"] == codec and again.info()["key_shards"] == 3
    for query in QUERIES:
        assert [p.id for p, _ in again.retrieve(query, 5)] == [p.id for p, _ in index.retrieve(query, 5)]


def test_a_codec_that_cannot_be_trained_or_fit_is_refused_before_any_work(corpus, path_lm, tmp_path):
    with pytest.raises(ValueError, match="divides the key width 64"):
        build_index_on_ray(corpus, path_lm, tmp_path / "index", key_codec="pq7")
    with pytest.raises(ValueError, match="needs at least 256 keys"):  # one passage holds fewer entries
        build_index_on_ray(corpus[:1], path_lm, tmp_path / "index", key_codec="pq8")
    assert not (tmp_path / "index").exists()


def test_a_sharded_index_saves_again_and_loads_memory_mapped(on_ray, path_lm, tmp_path):
    index, _ = on_ray
    copy = index.save(tmp_path / "copy")
    again = NestIndex.load(copy, path_lm)
    keys = again.datastore.precomputed
    assert isinstance(keys.segments[0].keys, np.memmap)
    assert np.array_equal(keys.passage(9).keys, index.datastore.precomputed.passage(9).keys)
    assert again.info()["key_shards"] == 3


def test_a_worker_with_another_model_is_refused(cluster, corpus, tiny_path, tmp_path):
    edited = load_lm(str(tiny_path), device="cpu")
    with torch.no_grad():
        next(edited.model.parameters()).add_(0.01)  # the driver's weights now differ from the files workers load
    with pytest.raises(ValueError, match="fingerprint"):
        build_index_on_ray(corpus[:2], edited, tmp_path / "index", workers=1)
    assert not (tmp_path / "index").exists()


def test_ray_generate_keeps_the_order_and_equals_in_process(cluster, single, tiny_path, tmp_path):
    folder = single.save(tmp_path / "index")
    items = tmp_path / "items.jsonl"
    prompts = [f"Tell me about {p.title}." for p in single.passages[:5]]
    items.write_text("".join(json.dumps({"id": f"q{i}", "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    common = ["generate", "--input", str(items), "-d", str(folder), "--model", str(tiny_path), "--max-new-tokens", "6", "--batch-size", "2"]
    local = CliRunner().invoke(app, [*common, "--output", str(tmp_path / "local.jsonl")])
    assert local.exit_code == 0, local.output
    spread = CliRunner().invoke(app, [*common, "--output", str(tmp_path / "ray.jsonl"), "--ray", "--workers", "2"])
    assert spread.exit_code == 0, spread.output
    lines = [json.loads(line) for line in (tmp_path / "ray.jsonl").read_text().splitlines()]
    assert [r["id"] for r in lines] == [f"q{i}" for i in range(5)]
    expected = [json.loads(line) for line in (tmp_path / "local.jsonl").read_text().splitlines()]
    assert [r["text"] for r in lines] == [r["text"] for r in expected]
    assert [r["input_sha256"] for r in lines] == [r["input_sha256"] for r in expected]
    # The calibrated alpha/tau the workers decode with are recorded, as in-process: a resume after `nest calibrate` is refused.
    assert lines[0]["settings"]["alpha"] is not None and lines[0]["settings"]["tau"] is not None
    assert [r["settings"] for r in lines] == [r["settings"] for r in expected]


def test_a_tampered_shard_or_shard_list_is_refused(on_ray, path_lm, tmp_path):
    import shutil

    _, out = on_ray
    flipped = shutil.copytree(out, tmp_path / "flipped")
    keys = flipped / "keys" / "shard-00001" / "keys.npy"
    data = bytearray(keys.read_bytes())
    data[-1] ^= 0xFF
    keys.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="shard-00001/keys.npy does not match its checksum"):
        NestIndex.load(flipped, path_lm)
    short = shutil.copytree(out, tmp_path / "short")
    manifest = json.loads((short / "manifest.json").read_text())
    manifest["key_shards"][2]["passages"] = 1
    (short / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="the key shards cover 9 passages, the index has 10"):
        NestIndex.load(short, path_lm)


def test_a_forged_shard_is_refused_naming_the_shard(on_ray, path_lm, tmp_path):
    """Checksums rewritten to match (a forgery, not an accident) still meet the array checks, which name the shard."""
    import shutil

    from nest_integrations.core.safe_io import sha256_file

    forged = shutil.copytree(on_ray[1], tmp_path / "forged")
    offsets = forged / "keys" / "shard-00001" / "offsets.npy"
    shifted = np.load(offsets)
    shifted[1] += 1  # passage 0 of the shard takes a token of passage 1
    np.save(offsets, shifted)
    manifest = json.loads((forged / "manifest.json").read_text())
    manifest["checksums"]["keys/shard-00001/offsets.npy"] = sha256_file(offsets)
    (forged / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"keys/shard-00001: the index's character spans"):
        NestIndex.load(forged, path_lm)


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_ray_address_fails_in_bounded_time(corpus_file, tiny_path, tmp_path):
    """`nest index build --ray-address` where nothing listens: a clear error in seconds (ray.init alone retries
    for minutes). A fresh process, since this module's cluster would otherwise be reused."""
    import subprocess
    import sys
    import time

    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "nest_integrations.cli", "index", "build", str(corpus_file), "--out", str(tmp_path / "index"),
         "--model", str(tiny_path), "--max-tokens", "0", "--ray-address", f"127.0.0.1:{closed_port()}", "--ray-timeout", "5"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "no Ray cluster answers at 127.0.0.1:" in done.stderr and "ray start --head" in done.stderr
    assert time.perf_counter() - start < 60  # interpreter, torch and the tiny LM included; the Ray check itself is ~0 s
    assert not (tmp_path / "index").exists()


def test_something_other_than_ray_at_the_address_fails_within_the_timeout():
    """A listener that never answers (not a Ray GCS): refused once --ray-timeout is spent."""
    import socket
    import threading
    import time

    from nest_integrations.index.distributed import check_reachable

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        accepted = []
        threading.Thread(target=lambda: accepted.append(silent.accept()), daemon=True).start()
        start = time.perf_counter()
        with pytest.raises(ValueError, match=r"answers, but not as a Ray cluster's GCS"):
            check_reachable(f"127.0.0.1:{silent.getsockname()[1]}", timeout_s=2)
        assert time.perf_counter() - start < 10


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its parent to reap it is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_driver_leaves_no_ray_process_behind(tmp_path):
    """SIGKILL a process inside ray_cluster() (a local cluster it started): every Ray process it
    started is gone within seconds (without the watcher, Ray's two agents stayed for minutes)."""
    import signal
    import subprocess
    import sys
    import time

    from nest_integrations.index.ray_reaper import ray_descendants

    script = "import time\nfrom nest_integrations.index.distributed import ray_cluster\nwith ray_cluster(num_cpus=1):\n" \
             "    print('cluster up', flush=True)\n    time.sleep(300)\n"
    driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert driver.stdout.readline().strip() == "cluster up"
        deadline = time.monotonic() + 60
        started: dict[int, int] = {}
        while time.monotonic() < deadline:  # the raylet starts its agents after ray.init returns
            started.update(ray_descendants(driver.pid))
            titles = {open(f"/proc/{pid}/cmdline", "rb").read() for pid in started if running(pid)}
            if any(b"DashboardAgent" in t for t in titles) and any(b"runtime_env" in t for t in titles):
                break
            time.sleep(0.5)
        time.sleep(1)  # > the watcher's poll, so it has seen them too
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(running(pid) for pid in started):
            time.sleep(0.5)
        left = [pid for pid in started if running(pid)]
        assert started and not left
    finally:
        if driver.poll() is None:
            driver.kill()
