"""A sweep's headline: one predictor against none, paired per workload, bootstrapped over workloads."""

import numpy as np
import pandas as pd
import pytest

from workbench.analysis.sweep_ci import paired_change


def _cells():
    rows = []
    for w, (none, oracle) in {"a": (10.0, 4.0), "b": (20.0, 6.0), "c": (30.0, 20.0)}.items():
        for pred, v in (("none", none), ("oracle", oracle)):
            rows.append(dict(workload=w, policy="lru", arena="0.25", gate="none", predictor=pred, sync_misses=v))
            rows.append(dict(workload=w, policy="fifo", arena="0.25", gate="none", predictor=pred, sync_misses=2 * v))
    return pd.DataFrame(rows)


def test_ratio_of_means_with_an_interval_over_workloads():
    r = paired_change(_cells(), "sync_misses", policy="lru", arena="0.25")
    assert r["value"] == pytest.approx(30 / 60 - 1) and r["n_workloads"] == 3
    assert r["base_mean"] == pytest.approx(20) and r["other_mean"] == pytest.approx(10)
    assert r["low"] < r["value"] < r["high"]  # workloads disagree: a real interval
    assert -1 <= r["low"] and r["high"] <= 0


def test_missing_predictor_is_named():
    with pytest.raises(ValueError, match="predictor layer"):
        paired_change(_cells(), "sync_misses", other="layer", policy="lru")
    with pytest.raises(ValueError, match="no 'bytes' column"):
        paired_change(_cells(), "bytes")
    assert np.isnan(paired_change(_cells().assign(sync_misses=0.0), "sync_misses")["value"])
