"""Resumable JSONL generation jobs: input order kept, a killed job resumes without redoing items,
and an output of another job is refused, untouched."""

from __future__ import annotations

import json

import pytest
from conftest import ListRetriever

from nest_integrations.decoding import NestDecoder
from nest_integrations.jobs import finished_items, in_process_runner, read_items, run_job

SETTINGS = {"mode": "nest", "max_new_tokens": 5, "model": None}


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
    items = read_items(input_file, SETTINGS)
    assert [i.line for i in items] == [1, 2, 4, 5, 6, 7, 8]
    full = tmp_path / "full.jsonl"
    assert run_job(items, full, in_process_runner(decoder), chunk_size=2) == len(items)
    done_lines = full.read_text(encoding="utf-8").splitlines(keepends=True)
    assert [json.loads(line)["id"] for line in done_lines] == [f"q{i}" for i in range(7)]

    # What a kill leaves: three whole lines, then one cut in the middle of a write.
    partial = tmp_path / "partial.jsonl"
    kept = [line.replace('"text": "', '"text": "KEPT ', 1) for line in done_lines[:3]]  # marks lines not to regenerate
    partial.write_text("".join(kept) + done_lines[3][: len(done_lines[3]) // 2], encoding="utf-8")
    seen: list[int] = []
    assert run_job(items, partial, counting(in_process_runner(decoder), seen), chunk_size=2) == 4
    assert seen == [5, 6, 7, 8]  # only the items after the three finished ones, each once
    resumed = [json.loads(line) for line in partial.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in resumed] == [f"q{i}" for i in range(7)]
    assert all(r["text"].startswith("KEPT ") for r in resumed[:3])
    assert [r["text"] for r in resumed[3:]] == [json.loads(line)["text"] for line in done_lines[3:]]

    seen.clear()
    assert run_job(items, partial, counting(in_process_runner(decoder), seen), chunk_size=2) == 0 and seen == []


def test_an_output_of_other_settings_or_input_is_refused_untouched(decoder, input_file, tmp_path):
    output = tmp_path / "out.jsonl"
    run_job(read_items(input_file, SETTINGS)[:2], output, in_process_runner(decoder), chunk_size=2)
    before = output.read_bytes()
    for settings in ({**SETTINGS, "max_new_tokens": 6}, {**SETTINGS, "mode": "base"}):
        with pytest.raises(ValueError, match=r"out\.jsonl:1 is not the output of input item 1"):
            run_job(read_items(input_file, settings), output, in_process_runner(decoder), chunk_size=2)
    edited = tmp_path / "edited.jsonl"
    edited.write_text(input_file.read_text(encoding="utf-8").replace("Alan Turing", "Ada Lovelace"), encoding="utf-8")
    with pytest.raises(ValueError, match=r"out\.jsonl:2 is not the output"):
        finished_items(output, read_items(edited, SETTINGS))
    (tmp_path / "notes.jsonl").write_text("my notes\nmore\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not a JSON line"):
        finished_items(tmp_path / "notes.jsonl", read_items(input_file, SETTINGS))
    assert output.read_bytes() == before
    assert (tmp_path / "notes.jsonl").read_text(encoding="utf-8") == "my notes\nmore\n"


@pytest.mark.parametrize(
    "line, message",
    [("{not json", "items.jsonl:2: invalid JSON"), ('{"id": 3}', "items.jsonl:2: each line needs a string 'prompt'"),
     ('{"prompt": "p", "query": 7}', "items.jsonl:2: 'query' must be a string")],
)
def test_bad_input_lines_are_named(tmp_path, line, message):
    path = tmp_path / "items.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_items(path, SETTINGS)
