"""Bootstrap confidence intervals over prompts: the one resampling rule every analysis uses.

A workload measurement is one value (or one row of values) per prompt. ``bootstrap_ci`` draws
``n_boot`` resamples of the prompts with replacement, applies ``stat`` to each, and returns the
statistic on all prompts with the percentile interval of the resampled statistics. The prompt is
the unit of resampling: tokens of one prompt are not independent (greedy output loops).

``interval_table`` turns a long table of per-prompt values into one row per group with the
interval columns every analysis reports: the measured column, ``low``, ``high``, ``n_prompts``.
``over_prompts`` runs one per-trace analysis on every prompt of a workload and does that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

N_BOOT = 2000
SEED = 0
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    n: int
    level: float = LEVEL

    def contains(self, x: float) -> bool:
        return bool(self.low - 1e-12 <= x <= self.high + 1e-12)

    def as_dict(self) -> dict:
        return {"value": self.estimate, "low": self.low, "high": self.high, "n_prompts": self.n}


def bootstrap_ci(values_by_prompt, stat: Callable = np.mean, n_boot: int = N_BOOT, seed: int = SEED,
                 level: float = LEVEL) -> Interval:
    """Percentile bootstrap over prompts.

    values_by_prompt: a sequence or array whose first axis is the prompt (a mapping's values are
    taken in order); rows may be vectors, then ``stat`` maps an [n, ...] array to a number (e.g. a
    speedup bound from a mean union table). NaN prompts are dropped. One prompt gives a zero-width
    interval at its value; none gives NaNs, and so does a statistic undefined on every resample.
    """
    if isinstance(values_by_prompt, Mapping):
        values_by_prompt = list(values_by_prompt.values())
    x = np.asarray(values_by_prompt, dtype=float)
    if x.ndim == 0:
        x = x[None]
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if len(x) == 0:
        return Interval(np.nan, np.nan, np.nan, 0, level)
    x = x[~np.isnan(x.reshape(len(x), -1)).any(axis=1)]
    n = len(x)
    if n == 0:
        return Interval(np.nan, np.nan, np.nan, 0, level)
    est = float(stat(x))
    if n == 1:
        return Interval(est, est, est, 1, level)
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    boots = np.array([stat(x[i]) for i in idx], dtype=float)
    if np.isnan(boots).all():  # the statistic is undefined on every resample (e.g. a change from 0)
        return Interval(est, np.nan, np.nan, n, level)
    lo, hi = np.nanquantile(boots, [(1 - level) / 2, (1 + level) / 2])
    return Interval(est, float(lo), float(hi), n, level)


def interval_table(per_prompt: pd.DataFrame, by: Sequence[str], value: str, prompt: str = "prompt",
                   stat: Callable = np.mean, unit: str = "prompt", **kw) -> pd.DataFrame:
    """One row per group of ``by``: the group keys, then ``value`` (the statistic over all
    units), low, high, n_<unit>s (the resampled units: prompts, or layers for weight analyses).

    ``per_prompt`` holds one row per (unit, group) with the measured ``value`` and the unit's name
    in column ``prompt``; a unit that appears twice in a group is an error (aggregate it first)."""
    by = list(by)
    dup = per_prompt.duplicated(by + [prompt])
    if dup.any():
        raise ValueError(f"per-prompt table has several rows per ({', '.join(by + [prompt])}); aggregate each prompt first")
    rows = []
    groups = per_prompt.groupby(by, sort=False, dropna=False) if by else [((), per_prompt)]
    for key, grp in groups:
        key = key if isinstance(key, tuple) else (key,)
        ci = bootstrap_ci(grp[value].to_numpy(), stat=stat, **kw)
        rows.append({**dict(zip(by, key)), value: ci.estimate, "low": ci.low, "high": ci.high, f"n_{unit}s": ci.n})
    out = pd.DataFrame(rows, columns=by + [value, "low", "high", f"n_{unit}s"])
    out.attrs["per_prompt"] = per_prompt.to_dict("list")  # plain lists: pd.concat compares attrs
    return out


def per_prompt(table: pd.DataFrame) -> pd.DataFrame:
    """The per-prompt rows an interval table was computed from."""
    if "per_prompt" not in table.attrs:
        raise ValueError("this table carries no per-prompt rows (build it with interval_table / over_prompts)")
    return pd.DataFrame(table.attrs["per_prompt"])


def over_prompts(traces: Mapping[str, object], analysis: Callable[[object], pd.DataFrame], by: Sequence[str],
                 value: str, progress: bool = False, **kw) -> pd.DataFrame:
    """Run ``analysis(trace) -> table`` on each prompt's trace ({prompt: trace}) and return
    ``interval_table`` of column ``value`` grouped by ``by``; ``per_prompt(table)`` gives back
    the per-prompt rows."""
    if not traces:
        raise ValueError("no prompts given; record a workload first (workbench.analysis.workload.record_workload)")
    items = list(traces.items())
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(items, desc="prompts", unit="prompt")
    per = [analysis(tr).assign(prompt=name) for name, tr in items]
    return interval_table(pd.concat(per, ignore_index=True), by, value, **kw)


# two-sided 97.5% quantiles of Student's t by degrees of freedom (larger df: the next smaller entry)
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def prediction_interval(values) -> tuple[float, float]:
    """95% prediction interval for one more prompt's value: mean +- t(n-1) * sd * sqrt(1 + 1/n).

    The interval to compare a value measured on a single prompt with (the interval of the mean is
    narrower the more prompts we run; a single prompt's value does not get closer to the mean).
    Fewer than 2 values give NaNs."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    n = len(x)
    if n < 2:
        return float("nan"), float("nan")
    t = _T975[max(d for d in _T975 if d <= n - 1)]
    half = t * float(np.std(x, ddof=1)) * np.sqrt(1 + 1 / n)
    return float(x.mean() - half), float(x.mean() + half)
