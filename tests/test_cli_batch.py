"""``nest generate`` output a script can read: ``--json`` is one line per answer, batch items may be
conversations (``messages``) with malformed ones named by line and field, each item's ``wall_s`` is
its own and the batch's totals go to stderr."""

from __future__ import annotations

import json
import time

import pytest
from conftest import ListRetriever
from typer.testing import CliRunner

from nest_integrations.cli import app
from nest_integrations.decoding.decoder import NestDecoder
from nest_integrations.index.jobs import read_items

CONVERSATION = [
    {"role": "user", "content": "Who was Marie Curie?"},
    {"role": "assistant", "content": "A physicist."},
    {"role": "user", "content": "Where was she born?"},
]


@pytest.fixture
def index_folder(monkeypatch, tiny_lm, small_passages, tmp_path):
    """An index of the three small passages built with the tiny LM, which every CLI load returns."""
    from nest_integrations.index.nest_index import NestIndex

    monkeypatch.setattr("nest_integrations.model.lm.load_lm", lambda *args, **kwargs: tiny_lm)
    return NestIndex.build(small_passages, tiny_lm, show_progress=False).save(tmp_path / "index")


def test_json_is_one_line_per_answer_and_pretty_indents(index_folder, tmp_path):
    run = ["generate", "Who was Marie Curie?", "-d", str(index_folder), "--model", "tiny", "--max-new-tokens", "4", "--json"]
    answers = tmp_path / "answers.jsonl"
    for _ in range(2):  # appending answers gives JSONL
        result = CliRunner().invoke(app, run)
        assert result.exit_code == 0, result.output
        with answers.open("a", encoding="utf-8") as handle:
            handle.write(result.stdout)
    lines = answers.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and all(json.loads(line)["stats"]["new_tokens"] for line in lines)
    pretty = CliRunner().invoke(app, [*run, "--pretty"])
    assert pretty.exit_code == 0 and pretty.stdout.count("\n") > 10
    assert json.loads(pretty.stdout)["spans"] == json.loads(lines[0])["spans"]
    alone = CliRunner().invoke(app, run[:-1] + ["--pretty"])
    assert alone.exit_code == 2 and "--pretty formats --json" in alone.output


def test_batch_items_may_be_conversations_and_the_totals_go_to_stderr(index_folder, tmp_path):
    items, output = tmp_path / "items.jsonl", tmp_path / "out.jsonl"
    items.write_text(
        json.dumps({"id": "first", "prompt": "Who was Marie Curie?"}) + "\n"
        + json.dumps({"id": "follow-up", "messages": CONVERSATION}) + "\n", encoding="utf-8",
    )
    result = CliRunner().invoke(
        app, ["generate", "--input", str(items), "--output", str(output), "-d", str(index_folder), "--model", "tiny", "--max-new-tokens", "4"]
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in records] == ["first", "follow-up"] and all(r["stats"]["new_tokens"] for r in records)
    summary = [line for line in result.stderr.splitlines() if line.startswith("batch:")]
    assert len(summary) == 1, result.stderr
    tokens = sum(r["stats"]["new_tokens"] for r in records)
    assert summary[0].startswith(f"batch: 2 items, {tokens} tokens in ") and "tokens/s" in summary[0]


def test_a_conversation_item_answers_as_the_decoder_given_its_messages(tiny_lm, tiny_datastore, small_passages, tmp_path):
    """The job hands the messages to the decoder: its retrieval query is the conversation's."""
    items = tmp_path / "items.jsonl"
    items.write_text(json.dumps({"messages": CONVERSATION}) + "\n", encoding="utf-8")
    [item] = read_items(items)
    assert item.prompt == CONVERSATION and item.query is None and item.id == "1"
    seen = []

    class Recording(ListRetriever):
        def retrieve(self, query, k):
            seen.append(query)
            return super().retrieve(query, k)

    decoder = NestDecoder(tiny_lm, tiny_datastore, Recording(small_passages))
    decoder.generate_batch([item.prompt], queries=[item.query], max_new_tokens=2, max_batch=1)
    assert seen == ["Who was Marie Curie?\nWhere was she born?"]


@pytest.mark.parametrize(
    "item, message",
    [
        ({"prompt": "p", "messages": CONVERSATION}, "items.jsonl:2: give 'prompt' or 'messages', not both"),
        ({"messages": []}, "items.jsonl:2: 'messages' must be a non-empty list"),
        ({"messages": "Who?"}, "items.jsonl:2: 'messages' must be a non-empty list"),
        ({"messages": [{"role": "user", "content": "Who?"}, "Where?"]}, r"items.jsonl:2: 'messages\[1\]' must be a"),
        ({"messages": [{"role": "human", "content": "Who?"}]}, r"items.jsonl:2: 'messages\[0\].role' must be one of system, user, assistant, got 'human'"),
        ({"messages": [{"role": "user", "content": 3}]}, r"items.jsonl:2: 'messages\[0\].content' must be a string"),
        ({"messages": CONVERSATION[:2]}, r"items.jsonl:2: 'messages\[1\]' must be the user's question"),
        ({"id": "x"}, "items.jsonl:2: each line needs a string 'prompt' or a 'messages' list"),
    ],
)
def test_malformed_conversation_items_are_named_by_line_and_field(tmp_path, item, message):
    path = tmp_path / "items.jsonl"
    path.write_text('{"prompt": "fine"}\n' + json.dumps(item) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_items(path)


def test_each_batch_item_wall_time_is_its_own(tiny_lm, tiny_datastore, small_passages):
    """Rows of one batch call are all prepared before the batch starts: the first row's wall time
    must not hold the other rows' preparation (here 0.4 s of retrieval each)."""

    class Slow(ListRetriever):
        def retrieve(self, query, k):
            time.sleep(0.4)
            return super().retrieve(query, k)

    decoder = NestDecoder(tiny_lm, tiny_datastore, Slow(small_passages))
    outputs = decoder.generate_batch(["Marie Curie?", "Alan Turing?", "Comets?"], max_new_tokens=3, max_batch=3)
    for output in outputs:
        s = output.stats
        assert s.retrieval_s >= 0.4 and s.wall_s >= s.retrieval_s + s.decode_s
        assert s.wall_s - s.decode_s < 0.4 + 0.6  # its own retrieval; the others' two would make it 0.8 more


def test_a_second_job_on_the_same_output_is_refused_and_the_first_writes_each_item_once(index_folder, tmp_path, monkeypatch):
    """Two ``nest generate --input X --output O`` at once: the second one is refused with a clear message while
    the first runs, instead of both appending (duplicated, interleaved lines)."""
    items, output = tmp_path / "items.jsonl", tmp_path / "out.jsonl"
    items.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Who was person {i}?"}) + "\n" for i in range(4)), encoding="utf-8")
    job = ["generate", "--input", str(items), "--output", str(output), "-d", str(index_folder), "--model", "tiny",
           "--max-new-tokens", "2", "--batch-size", "2"]
    generate_batch, second = NestDecoder.generate_batch, []

    def meanwhile(self, *args, **kwargs):
        if not second:  # the first job is running: start another on the same output
            second.append(CliRunner().invoke(app, job))
        return generate_batch(self, *args, **kwargs)

    monkeypatch.setattr(NestDecoder, "generate_batch", meanwhile)
    first = CliRunner().invoke(app, job)
    assert first.exit_code == 0, first.output
    assert second[0].exit_code == 2 and "is being written by another nest generate job" in " ".join(second[0].output.split())
    assert [json.loads(line)["id"] for line in output.read_text(encoding="utf-8").splitlines()] == ["q0", "q1", "q2", "q3"]
    again = CliRunner().invoke(app, job)  # the lock ends with the job: a resume finds everything done
    assert again.exit_code == 0 and "4 kept from an earlier run" in " ".join(again.output.split())


def test_a_job_that_fails_before_writing_leaves_no_output_behind(index_folder, tmp_path):
    items, output = tmp_path / "items.jsonl", tmp_path / "out.jsonl"
    items.write_text(json.dumps({"prompt": "Who?"}) + "\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["generate", "--input", str(items), "--output", str(output), "-d", str(tmp_path / "nowhere"), "--model", "tiny"])
    assert result.exit_code == 2 and not output.exists()
