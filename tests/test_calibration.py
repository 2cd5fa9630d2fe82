"""RRC calibration: fitting alpha/tau from ratio distributions."""

import numpy as np
import pytest

from nest_integrations.calibration import best_threshold, fit_alpha_tau


def test_threshold_separates_known_from_unknown_ratios():
    rng = np.random.default_rng(0)
    known = rng.uniform(0.0, 0.05, 500)
    unknown = rng.uniform(0.1, 0.4, 500)
    alpha, accuracy = best_threshold(known, unknown)
    assert 0.05 <= alpha <= 0.1 and accuracy == 1.0
    fitted = fit_alpha_tau(known, unknown)
    assert fitted["alpha"] == pytest.approx(alpha, abs=1e-4) and fitted["tau"] > 0
    assert fitted["known_ratio_quantiles"]["0.5"] < fitted["unknown_ratio_quantiles"]["0.5"]


def test_overlapping_ratios_give_a_lower_accuracy_and_no_ratios_an_error():
    rng = np.random.default_rng(1)
    _, accuracy = best_threshold(rng.uniform(0, 0.2, 400), rng.uniform(0.1, 0.3, 400))
    assert 0.5 < accuracy < 1.0
    with pytest.raises(ValueError):
        best_threshold(np.array([]), np.array([]))
