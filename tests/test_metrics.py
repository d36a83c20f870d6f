import math

import numpy as np

from edgex.parity import metrics


def test_snr_identical_is_inf_and_known_value():
    ref = np.array([3.0, -4.0])
    assert metrics.snr_db(ref, ref) == math.inf
    # noise energy 0.25 vs signal 25 -> 20 dB exactly
    assert math.isclose(metrics.snr_db(ref, ref + np.array([0.5, 0.0])), 20.0)


def test_snr_nan_output_is_minus_inf():
    assert metrics.snr_db(np.ones(3), np.array([1.0, np.nan, 1.0])) == -math.inf


def test_psnr_uses_peak_over_rmse():
    ref = np.array([1.0, 0.0, 0.0, 0.0])
    out = ref + 0.1
    assert math.isclose(metrics.psnr_db(ref, out), 20.0)


def test_cosine_and_agreement():
    assert math.isclose(metrics.cosine(np.array([1.0, 0.0]), np.array([0.0, 2.0])), 0.0)
    logits = np.array([[0.1, 0.9], [0.8, 0.2]])
    assert metrics.top1_agreement(logits, logits[:, ::-1]) == 0.0
    assert metrics.token_agreement(np.array([1, 2, 3]), np.array([1, 2, 4])) == 2 / 3
