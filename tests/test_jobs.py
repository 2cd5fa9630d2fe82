"""Resumable JSONL generation jobs: input order kept, a killed job resumes without redoing items,
an output of another job, input or settings (another index included) is refused, untouched,
naming what differs; --restart replaces only a job's output."""

from __future__ import annotations

import json

import pytest
from conftest import ListRetriever

from nest_integrations.decoding.decoder import NestDecoder
from nest_integrations.index.jobs import finished_items, in_process_runner, job_settings, read_items, run_job


def settings_of(decoder, index="index-sha"):
    return job_settings(index=index, lm_fingerprint=decoder.lm.fingerprint(), config=decoder.config)


@pytest.fixture
def decoder(tiny_lm, tiny_datastore, small_passages):
    decoder = NestDecoder(tiny_lm, tiny_datastore, ListRetriever(small_passages))
    decoder.config = decoder.config.updated(mode="nest", max_new_tokens=5)
    return decoder


@pytest.fixture
def input_file(tmp_path):
    path = tmp_path / "items.jsonl"
    prompts = ["Who was Marie Curie?", "Tell me about Alan Turing.", "Radioactivity?", "Who is Zoë Ångström?", "Name a comet.", "Warsaw?", "Oort cloud?"]
    lines = [json.dumps({"id": f"q{i}", "prompt": p}) for i, p in enumerate(prompts)]
    lines.insert(2, "")  # blank lines are skipped but keep the numbering of the lines after them
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def counting(runner, seen):
    """The runner, recording the line number of every item it generates."""

    def run(chunks):
        for number, outputs in runner(chunks):
            seen.extend(item.line for item in chunks[number])
            yield number, outputs

    return run


def test_a_killed_job_resumes_without_redoing_finished_items(decoder, input_file, tmp_path):
    items = read_items(input_file)
    settings = settings_of(decoder)
    assert [i.line for i in items] == [1, 2, 4, 5, 6, 7, 8]
    full = tmp_path / "full.jsonl"
    assert run_job(items, full, in_process_runner(decoder), settings=settings, chunk_size=2) == len(items)
    done_lines = full.read_text(encoding="utf-8").splitlines(keepends=True)
    assert [json.loads(line)["id"] for line in done_lines] == [f"q{i}" for i in range(7)]

    # What a kill leaves: three whole lines, then one cut in the middle of a write.
    partial = tmp_path / "partial.jsonl"
    kept = [line.replace('"text": "', '"text": "KEPT ', 1) for line in done_lines[:3]]  # marks lines not to regenerate
    partial.write_text("".join(kept) + done_lines[3][: len(done_lines[3]) // 2], encoding="utf-8")
    seen: list[int] = []
    assert run_job(items, partial, counting(in_process_runner(decoder), seen), settings=settings, chunk_size=2) == 4
    assert seen == [5, 6, 7, 8]  # only the items after the three finished ones, each once
    resumed = [json.loads(line) for line in partial.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in resumed] == [f"q{i}" for i in range(7)]
    assert all(r["text"].startswith("KEPT ") for r in resumed[:3])
    assert [r["text"] for r in resumed[3:]] == [json.loads(line)["text"] for line in done_lines[3:]]

    seen.clear()
    assert run_job(items, partial, counting(in_process_runner(decoder), seen), settings=settings, chunk_size=2) == 0 and seen == []


def test_a_complete_last_line_without_its_newline_is_kept_and_a_torn_one_regenerated(decoder, input_file, tmp_path):
    items, settings = read_items(input_file), settings_of(decoder)
    full = tmp_path / "full.jsonl"
    run_job(items[:3], full, in_process_runner(decoder), settings=settings, chunk_size=3)
    lines = full.read_bytes().splitlines(keepends=True)
    for last, kept in ((lines[2][:-1], 3), (lines[2][: len(lines[2]) // 2], 2)):  # killed before the newline / mid-line
        output = tmp_path / f"cut-{kept}.jsonl"
        output.write_bytes(lines[0] + lines[1] + last)
        seen: list[int] = []
        assert run_job(items, output, counting(in_process_runner(decoder), seen), settings=settings, chunk_size=2) == len(items) - kept
        assert seen == [i.line for i in items[kept:]]
        written = output.read_bytes()
        assert written.endswith(b"\n") and written.startswith(lines[0] + lines[1] + lines[2][:-1] * (kept == 3))
        assert [json.loads(line)["id"] for line in written.splitlines()] == [i.id for i in items]


def test_an_output_of_other_settings_or_input_is_refused_untouched_naming_what_differs(decoder, input_file, tmp_path):
    output = tmp_path / "out.jsonl"
    items, settings = read_items(input_file), settings_of(decoder)
    run_job(items[:2], output, in_process_runner(decoder), settings=settings, chunk_size=2)
    before = output.read_bytes()
    for other, named in (
        ({**settings, "max_new_tokens": 6}, "max_new_tokens: 5 then, 6 now"),
        ({**settings, "mode": "base"}, 'mode: "nest" then, "base" now'),
        ({**settings, "index": "another-index"}, 'index: "index-sha" then, "another-index" now'),
        ({**settings, "lm": "float16|..."}, "lm: "),
        ({**settings, "seed": 3}, "seed: null then, 3 now"),
    ):
        with pytest.raises(ValueError, match="other settings") as refused:
            run_job(items, output, in_process_runner(decoder), settings=other, chunk_size=2)
        assert named in str(refused.value) and "--restart" in str(refused.value) and "another --output" in str(refused.value)
    edited = tmp_path / "edited.jsonl"
    edited.write_text(input_file.read_text(encoding="utf-8").replace("Alan Turing", "Ada Lovelace"), encoding="utf-8")
    with pytest.raises(ValueError, match=r"out\.jsonl:2 is the output of item 'q1' \(input line 2\), not of the input's item 2"):
        finished_items(output, read_items(edited), settings)
    (tmp_path / "notes.jsonl").write_text("my notes\nmore\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not a JSON line"):
        finished_items(tmp_path / "notes.jsonl", items, settings)
    assert output.read_bytes() == before
    assert (tmp_path / "notes.jsonl").read_text(encoding="utf-8") == "my notes\nmore\n"


def test_restart_replaces_a_job_output_and_never_another_file(decoder, input_file, tmp_path):
    items, settings = read_items(input_file), settings_of(decoder)
    output = tmp_path / "out.jsonl"
    run_job(items[:2], output, in_process_runner(decoder), settings=settings, chunk_size=2)
    other = {**settings, "index": "another-index"}
    assert run_job(items[:2], output, in_process_runner(decoder), settings=other, chunk_size=2, restart=True) == 2
    assert {json.loads(line)["settings"]["index"] for line in output.read_text(encoding="utf-8").splitlines()} == {"another-index"}
    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"mine": 1}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="not the output of a generation job; not touching it"):
        run_job(items, notes, in_process_runner(decoder), settings=settings, chunk_size=2, restart=True)
    assert notes.read_text(encoding="utf-8") == '{"mine": 1}\n'


@pytest.mark.parametrize(
    "line, message",
    [("{not json", "items.jsonl:2: invalid JSON"), ('{"id": 3}', "items.jsonl:2: each line needs a string 'prompt'"),
     ('{"prompt": "p", "query": 7}', "items.jsonl:2: 'query' must be a string")],
)
def test_bad_input_lines_are_named(tmp_path, line, message):
    path = tmp_path / "items.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_items(path)


def test_nest_generate_resumed_over_another_index_is_refused_naming_it(monkeypatch, tiny_lm, small_passages, tmp_path):
    """The reported mix: a rerun of `nest generate --input X --output Y` with another -d kept the
    lines written over the first index. Now it names the index and the ways out; --restart redoes all."""
    from typer.testing import CliRunner

    from nest_integrations.cli import app
    from nest_integrations.index.nest_index import NestIndex, index_identity

    monkeypatch.setattr("nest_integrations.model.lm.load_lm", lambda *args, **kwargs: tiny_lm)
    first = NestIndex.build(small_passages, tiny_lm, show_progress=False).save(tmp_path / "first")
    second = NestIndex.build(small_passages[:2], tiny_lm, show_progress=False).save(tmp_path / "second")
    items, output = tmp_path / "items.jsonl", tmp_path / "out.jsonl"
    items.write_text('{"id": "a", "prompt": "Who was Marie Curie?"}\n{"id": "b", "prompt": "Radioactivity?"}\n')
    run = ["generate", "--input", str(items), "--output", str(output), "--model", "tiny", "--max-new-tokens", "3"]

    assert CliRunner().invoke(app, [*run, "-d", str(first)]).exit_code == 0
    written = output.read_bytes()
    refused = CliRunner().invoke(app, [*run, "-d", str(second)])
    message = " ".join(refused.output.split())
    assert refused.exit_code == 2 and "other settings (" in message and "index: " in message and "--restart" in message
    assert output.read_bytes() == written
    again = CliRunner().invoke(app, [*run, "-d", str(first)])  # same settings: nothing to redo
    assert again.exit_code == 0 and "2 kept from an earlier run" in " ".join(again.output.split())
    restarted = CliRunner().invoke(app, [*run, "-d", str(second), "--restart"])
    assert restarted.exit_code == 0 and "kept" not in restarted.output
    lines = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in lines] == ["a", "b"] and {r["settings"]["index"] for r in lines} == {index_identity(second)}
