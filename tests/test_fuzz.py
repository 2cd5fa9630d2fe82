"""Property-based checks: whatever the input, the answer is a result or a ValueError / TypeError.

Prompts (any unicode, lone surrogates, empty, long), messages of any shape, NestConfig
keyword combinations, metadata values and corrupted saved indexes, each with a bounded
number of examples so the file runs in well under a minute on the tiny model.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from nest_integrations.core.config import NestConfig  # noqa: E402
from nest_integrations.core.jsonsafe import json_safe  # noqa: E402
from nest_integrations.corpus.passages import Passage  # noqa: E402
from nest_integrations.decoding.decoder import NestDecoder, check_prompt  # noqa: E402
from nest_integrations.decoding.output import NestOutput, SourceRef  # noqa: E402
from nest_integrations.index.nest_index import NestIndex  # noqa: E402
from nest_integrations.store.datastore import TokenDatastore  # noqa: E402
from nest_integrations.store.encoder import PassageEncoder  # noqa: E402

# Bounded and derandomized: the same examples on every run, so `make test` stays fast and reproducible.
_QUIET = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]
FAST = settings(max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=_QUIET)
FEW = settings(max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=_QUIET)
GEN = dict(mode="base", max_new_tokens=1, use_chat_template=True)
EXPECTED = (ValueError, TypeError)

# Any code point, lone surrogates included (category Cs), plus long runs of one character.
any_text = st.one_of(
    st.text(st.characters(codec=None, categories=None), max_size=40),
    st.text(st.characters(categories=("Cs",)), min_size=1, max_size=3),
    st.builds(lambda c, n: c * n, st.characters(), st.integers(200, 2000)),
    st.just(""),
)
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_subnormal=False), st.text(max_size=10))
anything = st.recursive(
    st.one_of(json_scalars, st.binary(max_size=4), st.complex_numbers(max_magnitude=5, allow_subnormal=False), st.just(object())),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.one_of(st.text(max_size=4), st.integers()), inner, max_size=3)),
    max_leaves=8,
)
messages = st.lists(
    st.one_of(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]), "content": any_text}),
        st.dictionaries(st.sampled_from(["role", "content", "name"]), anything, max_size=3),
        anything,
    ),
    max_size=4,
)


@pytest.fixture(scope="module")
def decoder(tiny_lm) -> NestDecoder:
    passages = [Passage(id="p", title="Harbour", text="The harbour was rebuilt in 1901 after the great storm.")]
    return NestDecoder(tiny_lm, TokenDatastore(passages, PassageEncoder(tiny_lm)))


def _valid_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --------------------------------------------------------------------------- prompts
@FAST
@given(prompt=any_text)
def test_any_string_prompt_generates_or_is_refused_for_a_surrogate(decoder, prompt):
    if _valid_text(prompt):
        out = decoder.generate(prompt, **GEN)
        assert out.stats.new_tokens <= 1
    else:
        with pytest.raises(ValueError, match="lone surrogate"):
            decoder.generate(prompt, **GEN)


@FAST
@given(prompt=st.one_of(messages, anything))
def test_any_message_list_generates_or_raises_value_or_type_error(decoder, prompt):
    try:
        check_prompt(prompt)
    except EXPECTED as err:
        with pytest.raises(type(err)):
            decoder.generate(prompt, **GEN)
        with pytest.raises(type(err)):
            decoder.generate_batch([prompt], **GEN)
        with pytest.raises(type(err)):
            decoder.score(prompt, " x", mode="base")
        return
    decoder.generate(prompt, **GEN)


@pytest.mark.parametrize("prompt", [["hello"], 5, {"role": "user", "content": "hi"}])
def test_a_malformed_prompt_is_refused_before_retrieval_in_datastore_modes(decoder, prompt):
    with pytest.raises(EXPECTED, match="message|prompt"):
        decoder.generate(prompt, mode="nest", max_new_tokens=1)


@FEW
@given(prompts=st.one_of(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=2), anything))
def test_generate_batch_takes_only_a_list_of_prompts(decoder, prompts):
    try:
        outputs = decoder.generate_batch(prompts, **GEN)
    except EXPECTED:
        return
    assert isinstance(prompts, (list, tuple)) and len(outputs) == len(prompts)


# --------------------------------------------------------------------------- NestConfig
floats = st.one_of(st.floats(allow_subnormal=False), st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-300]))
config_values = {
    "alpha": floats,
    "tau": floats,
    "gamma": floats,
    "temperature": floats,
    "top_p": floats,
    "delta": floats,
    "seed": st.one_of(st.none(), st.integers(-(2**70), 2**70)),
    "stop": st.one_of(st.lists(st.text(max_size=3), max_size=3), anything),
    "max_new_tokens": st.integers(-5, 2000),
    "span_length": st.integers(-5, 1000),
    "passage_k": st.integers(-5, 2000),
    "mode": st.one_of(st.sampled_from(["base", "rag", "knnlm", "nest", "ra_nest", "NEST", ""]), anything),
    "max_prompt_tokens": st.one_of(st.none(), st.integers(-5, 2000)),
    "not_a_field": anything,
}


@FAST
@given(kwargs=st.dictionaries(st.sampled_from(sorted(config_values)), st.none()).flatmap(
    lambda keys: st.fixed_dictionaries({k: config_values[k] for k in keys})
))
def test_any_config_keywords_validate_or_raise_a_value_error_naming_the_field(kwargs):
    try:
        config = NestConfig(**kwargs)
    except ValidationError as err:
        assert isinstance(err, ValueError)
        assert {str(e["loc"][0]) for e in err.errors() if e["loc"]} <= set(kwargs) | {"__root__"}
        return
    for name in ("alpha", "tau", "gamma", "temperature"):  # alpha/tau None: left to calibration
        assert getattr(config, name) is None and name in ("alpha", "tau") or math.isfinite(getattr(config, name))
    assert config.seed is None or 0 <= config.seed < 2**64
    assert all(config.stop)


@FEW
@given(max_new_tokens=st.integers(0, 700), prompt=st.text(st.characters(categories=("L", "Zs")), max_size=300))
def test_max_new_tokens_either_fits_the_context_or_is_refused(decoder, max_new_tokens, prompt):
    context = decoder.lm.context_length
    config = NestConfig(max_new_tokens=max_new_tokens, use_chat_template=False)
    stats = NestOutput(text="", mode="base").stats
    try:
        ids = decoder.encode_prompt(decoder.format_prompt(prompt, config), config, stats)
    except ValueError as err:
        assert "max_new_tokens" in str(err) and max_new_tokens > context - NestDecoder.MIN_PROMPT_TOKENS
        return
    assert len(ids) >= 1 and len(ids) + max_new_tokens <= context


# --------------------------------------------------------------------------- metadata
@FAST
@given(metadata=st.dictionaries(st.text(max_size=5), st.one_of(
    anything,
    st.builds(np.float32, st.floats(width=32, allow_subnormal=False)),
    st.builds(np.int64, st.integers(-(2**63), 2**63 - 1)),
    st.builds(np.array, st.lists(st.integers(-100, 100), max_size=4)),
    st.dates(),
    st.datetimes(),
), max_size=4))
def test_metadata_becomes_json_at_passage_creation_or_is_refused_naming_the_key(metadata):
    try:
        passage = Passage(id="p", text="t", metadata=metadata)
    except ValueError as err:
        assert str(err).startswith("Passage 'p': metadata")
        return
    dumped = json.dumps(passage.metadata)  # plain JSON types only (NaN stays a float)
    assert json_safe(passage.metadata) == passage.metadata or "NaN" in dumped
    ref = SourceRef(id="p", metadata=passage.metadata)
    NestOutput(text="", mode="nest", sources=[ref]).model_dump_json()
    assert isinstance(json.loads(json.dumps(NestOutput(text="", mode="nest", sources=[ref]).to_dict())), dict)


def test_dates_and_numpy_round_trip_exactly():
    metadata = {"d": dt.date(2020, 2, 29), "f": np.float32(0.25), "a": np.arange(2)}
    ref = SourceRef(id="p", metadata=Passage(id="p", text="t", metadata=metadata).metadata)
    assert NestOutput(text="", mode="nest", sources=[ref]).to_dict()["sources"][0]["metadata"] == {
        "d": "2020-02-29", "f": 0.25, "a": [0, 1]
    }


# --------------------------------------------------------------------------- saved folders
@pytest.fixture(scope="module")
def saved(tmp_path_factory, tiny_lm):
    passages = [
        Passage(id=f"p{i}", title=f"T{i}", text=f"Passage number {i} tells of the harbour and the storm of 19{i:02d}.")
        for i in range(5)
    ]
    index = NestIndex.build(passages, tiny_lm, precompute_keys=True, show_progress=False)
    path = index.save(tmp_path_factory.mktemp("fuzz") / "index")
    return path, index.dense._embedder


def _files(path: Path) -> list[str]:
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())


def _load(folder: Path, tiny_lm, embedder) -> None:
    try:
        NestIndex.load(folder, tiny_lm, embedder=embedder)
    except ValueError:
        pass  # refused clearly; any other exception type fails the test


def _mutate(value: Any, data: Any) -> Any:
    """``value`` (parsed JSON) with one nested entry replaced or removed."""
    if isinstance(value, dict) and value and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(value)))
        out = dict(value)
        if data.draw(st.booleans()):
            del out[key]
        else:
            out[key] = _mutate(value[key], data)
        return out
    if isinstance(value, list) and value and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(value) - 1))
        return [*value[:i], _mutate(value[i], data), *value[i + 1 :]]
    return data.draw(st.one_of(json_scalars, st.lists(json_scalars, max_size=2), st.dictionaries(st.text(max_size=3), json_scalars, max_size=2),
                               st.sampled_from([True, 0, -5, 99, "../secret.txt", "/etc/hostname", {}, []])))


def _copy_of(saved, tmp_path_factory):
    """A fresh copy of the saved index folder to corrupt, and its embedder."""
    path, embedder = saved
    folder = tmp_path_factory.mktemp("copy") / "index"
    shutil.copytree(path, folder)
    return folder, embedder


@FEW
@given(data=st.data())
def test_a_corrupted_manifest_is_refused_with_a_value_error(saved, tiny_lm, tmp_path_factory, data):
    folder, embedder = _copy_of(saved, tmp_path_factory)
    manifest = json.loads((folder / "manifest.json").read_text())
    choice = data.draw(st.sampled_from(["mutate", "text", "deep"]))
    if choice == "mutate":
        text = json.dumps(_mutate(manifest, data))
    elif choice == "text":
        text = data.draw(st.text(max_size=50))
    else:
        text = "[" * data.draw(st.integers(1000, 200_000))
    (folder / "manifest.json").write_text(text, encoding="utf-8", errors="surrogatepass")
    _load(folder, tiny_lm, embedder)


@FEW
@given(data=st.data())
def test_a_corrupted_data_file_is_refused_with_a_value_error(saved, tiny_lm, tmp_path_factory, data):
    from nest_integrations.core.safe_io import sha256_file

    folder, embedder = _copy_of(saved, tmp_path_factory)
    name = data.draw(st.sampled_from([f for f in _files(folder) if f != "manifest.json"]))
    target = folder / name
    how = data.draw(st.sampled_from(["flip", "truncate", "delete", "replace"]))
    raw = bytearray(target.read_bytes())
    if how == "flip" and raw:
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
        target.write_bytes(bytes(raw))
    elif how == "truncate":
        target.write_bytes(bytes(raw[: data.draw(st.integers(0, max(len(raw) - 1, 0)))]))
    elif how == "delete":
        target.unlink()
    else:
        target.write_bytes(data.draw(st.binary(max_size=64)))
    # A tamperer who also fixes the checksum: text files only for now (binary ones: the two tests below).
    if target.exists() and target.suffix in (".json", ".jsonl") and data.draw(st.booleans()):
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["checksums"][name] = sha256_file(target)
        (folder / "manifest.json").write_text(json.dumps(manifest))
    _load(folder, tiny_lm, embedder)


def _tamper_with_fixed_checksum(saved, tmp_path_factory, name: str, corrupt) -> tuple[Path, object]:
    """A copy of the saved index whose file ``name`` is rewritten by ``corrupt(bytes) -> bytes``
    and whose manifest checksum is fixed to match, as a tamperer would."""
    from nest_integrations.core.safe_io import sha256_file

    folder, embedder = _copy_of(saved, tmp_path_factory)
    target = folder / name
    target.write_bytes(corrupt(target.read_bytes()))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["checksums"][name] = sha256_file(target)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder, embedder


@pytest.mark.parametrize("name, corrupt", [("dense.faiss", lambda raw: raw[:10]), ("keys/offsets.npy", lambda raw: b"")])
def test_an_unreadable_binary_file_with_a_fixed_checksum_is_a_value_error(saved, tiny_lm, tmp_path_factory, name, corrupt):
    folder, embedder = _tamper_with_fixed_checksum(saved, tmp_path_factory, name, corrupt)
    with pytest.raises(ValueError):
        NestIndex.load(folder, tiny_lm, embedder=embedder)


# --------------------------------------------------------------------------- JSONL
# Characters str.splitlines() (and text-mode files, for \r) treat as line ends, which JSON
# carries raw inside strings (json.dumps(ensure_ascii=False) leaves them as they are).
ODD_SEPARATORS = "\u2028\u2029\x85\x1c\x1d\x1e\x0b\x0c\r"
odd_text = st.text(alphabet=st.sampled_from(ODD_SEPARATORS + "ab é\t\"\\"), max_size=12).map(lambda t: "x" + t)  # never blank


@FAST
@given(
    records=st.lists(st.fixed_dictionaries({"text": odd_text, "title": odd_text}), min_size=1, max_size=4),
    crlf=st.booleans(), final_newline=st.booleans(), raw_cr_between_tokens=st.booleans(),
)
def test_jsonl_readers_split_on_newline_only(tmp_path_factory, records, crlf, final_newline, raw_cr_between_tokens):
    """Valid JSONL with U+2028, U+0085, \\r... in strings or between tokens, CRLF line ends and a last line
    without its newline: every reader (corpus, batch-job items) gets back exactly the records written."""
    from nest_integrations.core.jsonl import iter_jsonl
    from nest_integrations.corpus.loaders import load_jsonl
    from nest_integrations.index.jobs import read_items

    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    if raw_cr_between_tokens:
        lines = [line.replace(", ", ",\r ", 1) for line in lines]  # \r is JSON whitespace
    path = tmp_path_factory.mktemp("jsonl") / "records.jsonl"
    path.write_bytes((("\r\n" if crlf else "\n").join(lines) + ("\n" if final_newline else "")).encode("utf-8"))
    assert [record for _, record in iter_jsonl(path)] == records
    assert [(p.text, p.title) for p in load_jsonl(path)] == [(r["text"], r["title"]) for r in records]
    prompts = path.with_name("items.jsonl")
    prompts.write_bytes(path.read_bytes().replace(b'"text"', b'"prompt"'))
    assert [item.prompt for item in read_items(prompts)] == [r["text"] for r in records]


@pytest.mark.parametrize("content, message", [
    (b'{"text": "a"}\n{"text": "b"\n', r"records\.jsonl:2: invalid JSON"),
    (b'{"text": "a"}\n\n[1, 2]\n', r"records\.jsonl:3: expected a JSON object, got list"),
    (b'{"text": "\xff"}\n', r"records\.jsonl:1: not UTF-8"),
])
def test_a_bad_jsonl_line_is_named(tmp_path, content, message):
    from nest_integrations.core.jsonl import iter_jsonl

    path = tmp_path / "records.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        list(iter_jsonl(path))
