"""A sweep's answer with its uncertainty: one value of an axis against another (oracle read-ahead
against none), paired per workload and bootstrapped over workloads with the one resampling rule
(``uncertainty.bootstrap_ci``; a workload is one prompt's trace)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .uncertainty import bootstrap_ci


def paired_change(df: pd.DataFrame, metric: str, axis: str = "predictor", base: str = "none",
                  other: str = "oracle", **where) -> dict:
    """Relative change of ``metric`` from ``axis=base`` to ``axis=other`` (-0.6: 60% less), over the
    sweep cells matching ``where`` (e.g. policy="lru", arena="0.25"), as the ratio of the means over
    workloads: value, low, high (95% bootstrap over workloads), n_workloads, base_mean, other_mean."""
    if metric not in df.columns:
        raise ValueError(f"the sweep has no {metric!r} column; columns: {', '.join(df.columns)}")
    sel = df
    for key, value in where.items():
        sel = sel[sel[key].astype(str) == str(value)]
    per = sel.groupby(["workload", axis])[metric].mean().unstack(axis)
    missing = [v for v in (base, other) if v not in per.columns]
    if missing:
        raise ValueError(f"no sweep cells with {axis} {', '.join(missing)} matching {where}; "
                         f"{axis} values there: {', '.join(map(str, per.columns)) or 'none'}")
    x = per[[base, other]].dropna().to_numpy(float)

    def change(m):
        b = m[:, 0].mean()
        return m[:, 1].mean() / b - 1 if b > 0 else np.nan

    iv = bootstrap_ci(x, stat=change)
    return {"value": iv.estimate, "low": iv.low, "high": iv.high, "n_workloads": iv.n,
            "base_mean": float(x[:, 0].mean()) if len(x) else np.nan,
            "other_mean": float(x[:, 1].mean()) if len(x) else np.nan}
