"""RRC calibration: fitting alpha/tau from ratio distributions, on any corpus, while an index is built
(or at its first nest generation), saved with the index."""

import json

import numpy as np
import pytest

from nest_integrations.core.config import NestConfig
from nest_integrations.corpus.passages import Passage
from nest_integrations.index.nest_index import NestIndex
from nest_integrations.policy.calibration import (
    CALIBRATION_FILE,
    REFERENCE_UNKNOWN_SHARE,
    best_threshold,
    continuation_cuts,
    fit_alpha_tau,
)

# A corpus with no people in it: how-to documentation, as a user's own would be.
DOCS = [
    Passage(id=f"doc{i}", title=title, text=text)
    for i, (title, text) in enumerate(
        [
            ("Routes", "Routes map a method and a URL to a handler. A route is declared with app.get or app.post. "
             "The handler receives the request and a reply object. Returning a value sends it as the response."),
            ("Hooks", "Hooks run at fixed points of a request's life. The onRequest hook runs first, before parsing. "
             "A hook that throws ends the request with an error. Hooks are registered with app.addHook."),
            ("Logging", "Logging is off by default. Pass logger: true to turn it on. Each request gets a child logger "
             "with its own id. The level can be set per route with the logLevel option."),
            ("Plugins", "Plugins add routes, decorators and hooks. A plugin is an async function taking the instance "
             "and options. Plugins are loaded in order with app.register. Each plugin gets its own scope."),
            ("Validation", "Routes can validate their input with JSON schemas. The body, querystring and params each "
             "take a schema. Invalid input is answered with status 400. Schemas are compiled once at start-up."),
            ("Errors", "Errors thrown in a handler are sent as JSON with their status code. A custom error handler is "
             "set with setErrorHandler. Not found routes use setNotFoundHandler. Errors are logged at level error."),
        ]
    )
]


def test_threshold_separates_known_from_unknown_ratios():
    rng = np.random.default_rng(0)
    known = rng.uniform(0.0, 0.05, 500)
    unknown = rng.uniform(0.1, 0.4, 500)
    alpha, accuracy = best_threshold(known, unknown)
    assert 0.05 <= alpha <= 0.1 and accuracy == 1.0
    fitted = fit_alpha_tau(known, unknown)
    assert fitted["separating_alpha"] == pytest.approx(alpha, abs=1e-4) and fitted["balanced_accuracy"] == 1.0
    assert fitted["known_ratio_quantiles"]["0.5"] < fitted["unknown_ratio_quantiles"]["0.5"]


def test_alpha_follows_the_models_ratio_scale():
    """Two models whose ratios differ only in scale get alphas on their own scales, at the
    same quantile: a fixed alpha would leave the second one's LM weight near 1 everywhere."""
    rng = np.random.default_rng(2)
    known, unknown = rng.uniform(0.0, 0.2, 400), rng.uniform(0.1, 0.6, 400)
    low = fit_alpha_tau(known, unknown)
    high = fit_alpha_tau(0.5 + 0.5 * known, 0.5 + 0.5 * unknown)
    assert high["alpha"] == pytest.approx(0.5 + 0.5 * low["alpha"], abs=2e-3)
    assert high["tau"] == pytest.approx(0.5 * low["tau"], abs=2e-3)
    assert np.mean(unknown < low["alpha"]) == pytest.approx(REFERENCE_UNKNOWN_SHARE, abs=0.01)


def test_overlapping_ratios_give_a_lower_accuracy_and_no_ratios_an_error():
    rng = np.random.default_rng(1)
    _, accuracy = best_threshold(rng.uniform(0, 0.2, 400), rng.uniform(0.1, 0.3, 400))
    assert 0.5 < accuracy < 1.0
    with pytest.raises(ValueError):
        best_threshold(np.array([]), np.array([]))
    with pytest.raises(ValueError, match="no ratios"):
        fit_alpha_tau(np.array([]), np.array([0.2]))


def test_cuts_fall_on_sentence_starts_anywhere_in_a_passage():
    cuts = continuation_cuts(DOCS, 6, seed=0)
    assert len(cuts) == 6
    for passage, cut in cuts:
        assert cut > 0 and passage.text[cut - 2 : cut] == ". "
    assert len({cut for _, cut in cuts}) > 1
    assert continuation_cuts([Passage(id="x", text="One short sentence only.")], 4) == []


@pytest.fixture(scope="module")
def docs_index(tiny_lm, tmp_path_factory):
    """A saved index over DOCS with no calibration yet."""
    return NestIndex.build(DOCS, tiny_lm, show_progress=False, calibrate=False).save(tmp_path_factory.mktemp("calibration") / "index")


def test_an_index_meeting_an_lm_without_calibration_fits_one_on_its_own_corpus_and_saves_it(tiny_lm, docs_index):
    folder = docs_index
    assert not (folder / CALIBRATION_FILE).exists()
    index = NestIndex.load(folder, tiny_lm)
    decoder = index.decoder()
    decoder.generate("How are routes declared?", mode="base", max_new_tokens=2)
    decoder.generate("How are routes declared?", mode="nest", alpha=0.3, tau=0.1, max_new_tokens=2)
    assert decoder.calibration is None  # the LM alone, or explicit values: nothing to fit
    decoder.generate("How are routes declared?", mode="nest", max_new_tokens=2)
    fitted = decoder.calibration  # the default config leaves alpha/tau to calibration
    assert fitted is not None and fitted.passages == len(DOCS) and fitted.tokens > 0 and fitted.tau > 0
    assert fitted.lm_fingerprint == tiny_lm.fingerprint()
    assert 0.0 <= fitted.alpha <= 1.0 and 0.5 <= fitted.balanced_accuracy <= 1.0
    saved = json.loads((folder / CALIBRATION_FILE).read_text())
    assert saved["calibrations"][tiny_lm.fingerprint()]["alpha"] == fitted.alpha

    again = NestIndex.load(folder, tiny_lm).decoder()  # the saved calibration is used: nothing is fitted again
    assert again.calibration == fitted
    assert again.rrc_parameters(again.config) == (fitted.alpha, fitted.tau)
    assert again.rrc_parameters(NestConfig(alpha=0.3, tau=0.1)) == (0.3, 0.1)

    (folder / CALIBRATION_FILE).write_text("{not json")  # a broken cache is refitted, never trusted
    assert NestIndex.load(folder, tiny_lm).calibrations == {}


def saved_calibration(lm, **values) -> dict:
    """A calibration entry as ``calibration.json`` holds it, with ``values`` in place of the fitted ones."""
    quantiles = {"0.1": 0.1, "0.5": 0.2, "0.9": 0.3}
    entry = {
        "lm_name": lm.name, "lm_fingerprint": lm.fingerprint(), "alpha": 0.25, "tau": 0.05, "separating_alpha": 0.3,
        "balanced_accuracy": 0.8, "known_ratio_quantiles": quantiles, "unknown_ratio_quantiles": quantiles,
        "passages": 4, "tokens": 100, "seconds": 1.0,
    }
    return {**entry, **values}


@pytest.mark.parametrize(
    "values",
    [{"alpha": "NaN"}, {"alpha": "Infinity"}, {"alpha": "-Infinity"}, {"alpha": 1.5}, {"tau": "Infinity"}, {"tau": 1e-300},
     {"tau": 0.0}, {"known_ratio_quantiles": {"0.5": "NaN"}}, {"balanced_accuracy": "-Infinity"}],
)
def test_a_saved_calibration_not_finite_or_out_of_bounds_is_refitted_with_a_warning(tiny_lm, tmp_path, docs_index, values, caplog):
    import shutil

    folder = tmp_path / "index"
    shutil.copytree(docs_index, folder)
    good = saved_calibration(tiny_lm)
    bad = saved_calibration(tiny_lm, **values)
    raw = json.dumps({"format": "nest-calibration", "version": 1, "calibrations": {"other-lm": {**good, "lm_fingerprint": "other-lm"}, tiny_lm.fingerprint(): bad}})
    for literal in ("NaN", "Infinity", "-Infinity"):  # as Python's json writes them
        raw = raw.replace(f'"{literal}"', literal)
    (folder / CALIBRATION_FILE).write_text(raw)
    with caplog.at_level("WARNING", logger="nest_integrations.policy.calibration"):
        index = NestIndex.load(folder, tiny_lm)
    assert tiny_lm.fingerprint() not in index.calibrations, "a value no fit gives is never decoded with"
    assert list(index.calibrations) == ["other-lm"], "the other LMs' calibrations stay"
    assert any(str(folder / CALIBRATION_FILE) in r.getMessage() and "calibrated again" in r.getMessage() for r in caplog.records)
    decoder = index.decoder()
    decoder.generate("How are routes declared?", mode="nest", max_new_tokens=2)
    fitted = decoder.calibration  # fitted again on the first generation that needs one
    assert fitted is not None and np.isfinite([fitted.alpha, fitted.tau]).all() and 0.0 <= fitted.alpha <= 1.0 and fitted.tau >= 1e-3


def test_a_calibration_file_that_is_a_folder_is_an_error_naming_it(tiny_lm, tmp_path, docs_index, monkeypatch):
    import shutil

    from typer.testing import CliRunner

    from nest_integrations.cli import app

    folder = tmp_path / "index"
    shutil.copytree(docs_index, folder)
    (folder / CALIBRATION_FILE).unlink(missing_ok=True)
    (folder / CALIBRATION_FILE).mkdir()
    with pytest.raises(ValueError, match=f"{folder / CALIBRATION_FILE} is not a regular file"):
        NestIndex.load(folder, tiny_lm)
    monkeypatch.setattr("nest_integrations.model.lm.load_lm", lambda *args, **kwargs: tiny_lm)
    result = CliRunner().invoke(app, ["generate", "How are routes declared?", "-d", str(folder), "--model", "tiny", "--max-new-tokens", "2", "--server", "never"])
    assert result.exit_code == 2 and "calibration.json is not a regular file" in result.output.replace("\n", ""), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_an_index_loaded_before_a_rebuild_keeps_its_calibration_out_of_the_new_index(tiny_lm, tmp_path):
    folder = NestIndex.build(DOCS, tiny_lm, show_progress=False, calibrate=False).save(tmp_path / "index")
    old = NestIndex.load(folder, tiny_lm)
    NestIndex.build(DOCS[:4], tiny_lm, show_progress=False, calibrate=False).save(folder, overwrite=True)  # rebuilt meanwhile
    fitted = old.calibrate(n=2, budget_s=None, show_progress=False)
    assert old.calibrations == {tiny_lm.fingerprint(): fitted}, "kept in memory"
    assert not (folder / CALIBRATION_FILE).exists(), "the rebuilt index got a calibration of another corpus"
    again = NestIndex.load(folder, tiny_lm)
    again.calibrate(n=2, budget_s=None, show_progress=False)  # the index there now still saves its own
    assert tiny_lm.fingerprint() in json.loads((folder / CALIBRATION_FILE).read_text())["calibrations"]


def test_an_index_built_with_its_lm_is_calibrated_and_saved_so_the_first_question_fits_nothing(tiny_lm, tmp_path, monkeypatch):
    from nest_integrations.policy import calibration

    fits = []
    fit = calibration.calibrate

    def counted(*args, **kwargs):
        fits.append(fit(*args, **kwargs))
        return fits[-1]

    monkeypatch.setattr(calibration, "calibrate", counted)
    index = NestIndex.build(DOCS, tiny_lm, show_progress=False)
    assert len(fits) == 1 and index.calibrations == {tiny_lm.fingerprint(): fits[0]}
    folder = index.save(tmp_path / "index")
    saved = json.loads((folder / CALIBRATION_FILE).read_text())["calibrations"]
    assert saved[tiny_lm.fingerprint()]["alpha"] == fits[0].alpha

    decoder = NestIndex.load(folder, tiny_lm).decoder()
    first = decoder.generate("How are routes declared?", max_new_tokens=2)
    assert first.stats.calibration_s == 0.0 and len(fits) == 1, "the first question waited for no fit"
    assert decoder.rrc_parameters(decoder.config) == (fits[0].alpha, fits[0].tau)
    short = [Passage(id="x", text="One short sentence only.")]
    assert NestIndex.build(short, tiny_lm, show_progress=False).calibrations == {}  # nothing to fit on: no error


def test_nest_index_build_saves_a_calibration_and_generate_reports_each_phase_by_name(tiny_lm, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from nest_integrations.cli import app

    docs = tmp_path / "docs"
    docs.mkdir()
    for passage in DOCS:
        (docs / f"{passage.id}.txt").write_text(passage.text, encoding="utf-8")
    monkeypatch.setattr("nest_integrations.model.lm.load_lm", lambda *args, **kwargs: tiny_lm)
    runner = CliRunner()
    built = runner.invoke(app, ["index", "build", str(docs), "--out", str(tmp_path / "index"), "--model", "tiny"])
    assert built.exit_code == 0, built.output
    assert "Calibrated alpha" in built.output and (tmp_path / "index" / CALIBRATION_FILE).is_file()
    ask = ["generate", "How are routes declared?", "-d", str(tmp_path / "index"), "--model", "tiny", "--max-new-tokens", "4", "--server", "never"]
    answer = runner.invoke(app, [*ask, "--json"])
    assert answer.exit_code == 0, answer.output
    stats = json.loads(answer.stdout)["stats"]
    assert stats["calibration_s"] == 0.0 and stats["load_s"] > 0.0
    shown = " ".join(runner.invoke(app, ask).output.split())
    for phase in ("loading", "calibration", "retrieval", "encoding", "decoding"):
        assert f"{phase} " in shown, f"the timing line names {phase}: {shown}"
