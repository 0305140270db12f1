"""MTP union and the speedup bound for streaming-bound decode (DESIGN section 4).

union(g): mean number of distinct experts a layer must hold to verify a window of g consecutive
decode tokens (sliding windows over the decode rows of a trace). With top-k routing union(1) = k.
A linear fit union(g) ~= k (1 + s (g - 1)) gives the slope s (least squares through (1, k)).

Speedup bound (streaming-bound decode: a verify pass costs the experts it reads, nothing else):

    E(g, a)    = (1 - a^g) / (1 - a)      expected tokens per verify pass of g tokens (E(g, 1) = g)
    cost(g)    = union(g) / k             reads per pass relative to one plain decode step
    speedup(a) = max over g of E(g, a) / cost(g)

Because g = 1 (no drafting) always gives exactly 1, ``speedup(a) >= 1`` whenever g = 1 is allowed:
there is never a net loss if the drafter may decline to draft. The meaningful break-even is the
lowest acceptance at which some drafting window g >= 2 pays, i.e. min over g >= 2 of the a solving
E(g, a) = cost(g) (``break_even``). The free choices that move the numbers (which g are allowed,
and how union(g) is filled in between measured g) are arguments, and ``mtp_reference_check``
lays the reference claims out under each.

Ignored by the bound: draft cost, compute time, the bonus token, and that a verify pass reads
the union once for all g tokens while a real engine may already hold some experts.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from ._common import as_trace, phase_rows, ragged_sets, require_columns

REFERENCE_UNION = {1: 8.00, 2: 13.42, 3: 17.99, 8: 35.01}
REFERENCE_K = 8
DEFAULT_ACCEPTANCES = (0.5, 0.6, 0.7, 0.72, 0.75, 0.8, 0.85, 0.9, 0.95, 0.99)


# --------------------------------------------------------------------------- union from a trace
def parse_union_table(text: str) -> dict[int, float]:
    """Parse "1:8,2:13.42,3:17.99,8:35.01" -> {1: 8.0, 2: 13.42, 3: 17.99, 8: 35.01}."""
    out = {}
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        try:
            g, u = part.split(":")
            g, u = int(g), float(u)
        except ValueError:
            raise ValueError(f"bad union entry {part!r}; write G:UNION pairs like \"1:8,2:13.42,3:17.99,8:35.01\"") from None
        if g < 1 or u <= 0:
            raise ValueError(f"bad union entry {part!r}: window g must be >= 1 and union > 0")
        if g in out:
            raise ValueError(f"window g={g} given twice in the union table")
        out[g] = u
    if not out:
        raise ValueError("empty union table; write G:UNION pairs like \"1:8,2:13.42,3:17.99,8:35.01\"")
    return dict(sorted(out.items()))


def _window_unions(sel: list[np.ndarray], n_experts: int, g: int) -> np.ndarray:
    """Distinct experts in each sliding window of g consecutive rows."""
    t = len(sel)
    if g > t:
        return np.zeros(0)
    mask = np.zeros((t + 1, n_experts), dtype=np.int32)
    for i, s in enumerate(sel):
        mask[i + 1, s[s >= 0]] = 1
    c = np.cumsum(mask, axis=0)
    win = c[g:] - c[:-g]  # [t - g + 1, E]
    return (win > 0).sum(axis=1)


def union_by_window(
    trace,
    g_values: Iterable[int] = range(1, 9),
    phase: str | None = "decode",
    layers: Iterable[int] | None = None,
) -> pd.DataFrame:
    """Mean distinct experts over sliding windows of g consecutive tokens.

    Rows: scope ("layer" | "mean" | "total"), layer (Int64, <NA> for mean/total), g, union,
    union_over_k, n_windows. "mean" averages the layers; "total" sums them (experts to read per
    verify pass over all MoE layers).
    """
    tr = as_trace(trace)
    rows = phase_rows(tr, phase)
    require_columns(rows, ["selected"], "MTP union")
    if rows.empty:
        raise ValueError(f"trace has no {phase} rows; pass phase='all'")
    gs = sorted({int(g) for g in g_values})
    if not gs or gs[0] < 1:
        raise ValueError(f"window sizes must be >= 1, got {gs}")
    k = int(tr.meta.get("top_k") or len(rows["selected"].iloc[0]))
    n_exp = int(tr.meta.get("n_experts") or (max(int(max(s)) for s in rows["selected"] if len(s)) + 1))
    want = None if layers is None else {int(l) for l in layers}
    out = []
    for l, grp in rows.sort_values(["token", "step"], kind="stable").groupby("layer", sort=True):
        if want is not None and int(l) not in want:
            continue
        sel = ragged_sets(grp["selected"])
        for g in gs:
            u = _window_unions(sel, n_exp, g)
            if len(u):
                out.append(dict(scope="layer", layer=int(l), g=g, union=float(u.mean()), n_windows=int(len(u))))
    if not out:
        raise ValueError(f"no window fits: the trace has fewer {phase} tokens than the smallest window {gs[0]}")
    df = pd.DataFrame(out)
    agg = df.groupby("g").agg(union=("union", "mean"), total=("union", "sum"), n_windows=("n_windows", "min"),
                              n_layers=("layer", "nunique")).reset_index()
    mean = agg.assign(scope="mean", layer=pd.NA)[["scope", "layer", "g", "union", "n_windows"]]
    total = agg.assign(scope="total", layer=pd.NA, union=agg["total"])[["scope", "layer", "g", "union", "n_windows"]]
    df = pd.concat([df, mean, total], ignore_index=True)
    df["layer"] = df["layer"].astype("Int64")
    nl = agg.set_index("g")["n_layers"]
    df["union_over_k"] = np.where(df["scope"] == "total", df["union"] / (k * df["g"].map(nl)), df["union"] / k)
    df.attrs["k"] = k
    return df


def union_table(union) -> dict[int, float]:
    """{g: union} from a union_by_window table (its "mean" rows), a dict, or a "1:8,2:13.42" string."""
    if isinstance(union, str):
        return parse_union_table(union)
    if isinstance(union, pd.DataFrame):
        m = union[union["scope"] == "mean"] if "scope" in union.columns else union
        return {int(g): float(u) for g, u in zip(m["g"], m["union"])}
    if isinstance(union, Mapping):
        if not union:
            raise ValueError("empty union table")
        return {int(g): float(u) for g, u in sorted(union.items())}
    raise TypeError(f"union must be a dict, a union table string or a union_by_window DataFrame, not {type(union).__name__}")


def fit_union_slope(union, k: int) -> float:
    """Least-squares s in union(g) = k (1 + s (g - 1)) over the given g (through the point g = 1)."""
    u = union_table(union)
    x = np.array([g - 1 for g in u], float)
    y = np.array([u[g] / k - 1 for g in u], float)
    if not np.any(x > 0):
        raise ValueError("need at least one window g >= 2 to fit the union slope")
    return float((x * y).sum() / (x * x).sum())


# --------------------------------------------------------------------------- speedup bound
def expected_tokens(a, g):
    """(1 - a^g) / (1 - a): expected tokens per verify pass of window g at acceptance a (g at a = 1)."""
    a = np.asarray(a, float)
    g = np.asarray(g, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        e = (1 - a**g) / (1 - a)
    return np.where(np.isclose(a, 1.0), g, e)


def union_model(union, k: int, mode: str = "table", g_max: int | None = None, slope: float | None = None) -> dict[int, float]:
    """{g: union(g)} to optimise over.

    mode "table": only the measured g. "interp": every integer g from 1 to g_max, linear between
    measured points (g_max defaults to the largest measured g; no extrapolation). "fit": the
    linear model k (1 + s (g - 1)) for g = 1..g_max with s = ``slope`` or the least-squares fit.
    """
    u = union_table(union)
    gmax = g_max or max(u)
    if mode == "table":
        return dict(u)
    if mode == "interp":
        gs = np.array(sorted(u))
        if gmax > gs.max():
            raise ValueError(f"interp does not extrapolate: g_max={gmax} > largest measured g={gs.max()}; use mode='fit'")
        us = np.array([u[g] for g in gs])
        pts = {g: float(np.interp(g, gs, us)) for g in range(int(gs.min()), gmax + 1)}
        if 1 not in pts:
            pts[1] = float(k)
        return dict(sorted(pts.items()))
    if mode == "fit":
        s = fit_union_slope(u, k) if slope is None else float(slope)
        return {g: k * (1 + s * (g - 1)) for g in range(1, gmax + 1)}
    raise ValueError(f"mode must be 'table', 'interp' or 'fit', got {mode!r}")


def speedup_grid(union, k: int, acceptances: Iterable[float] = DEFAULT_ACCEPTANCES, mode: str = "table",
                 g_values: Iterable[int] | None = None, **model_kw) -> pd.DataFrame:
    """E(g, a) / cost(g) for every acceptance a and window g: acceptance, g, expected_tokens, union, cost, speedup."""
    u = union_model(union, k, mode, **model_kw)
    if g_values is not None:
        gv = {int(g) for g in g_values}
        missing = gv - set(u)
        if missing:
            raise ValueError(f"no union value for g={sorted(missing)} under mode={mode!r}; give it or use mode='interp'/'fit'")
        u = {g: v for g, v in u.items() if g in gv}
    acc = np.asarray(list(acceptances), float)
    if np.any((acc < 0) | (acc > 1)):
        raise ValueError(f"acceptance must be within [0, 1], got {acc.tolist()}")
    rows = []
    for a in acc:
        for g, ug in u.items():
            e = float(expected_tokens(a, g))
            c = ug / k
            rows.append(dict(acceptance=float(a), g=g, expected_tokens=e, union=ug, cost=c, speedup=e / c))
    return pd.DataFrame(rows)


def speedup_bound(union, k: int, acceptances: Iterable[float] = DEFAULT_ACCEPTANCES, mode: str = "table",
                  g_values: Iterable[int] | None = None, min_g: int = 1, **model_kw) -> pd.DataFrame:
    """Best window per acceptance: acceptance, best_g, speedup, expected_tokens, cost.

    min_g=1 lets the bound decline to draft (speedup >= 1); min_g=2 forces drafting."""
    grid = speedup_grid(union, k, acceptances, mode, g_values, **model_kw)
    grid = grid[grid["g"] >= min_g]
    if grid.empty:
        raise ValueError(f"no window g >= {min_g} in the union table")
    best = grid.loc[grid.groupby("acceptance")["speedup"].idxmax()]
    return best.rename(columns={"g": "best_g"})[["acceptance", "best_g", "speedup", "expected_tokens", "cost"]].reset_index(drop=True)


def ceiling(union, k: int, mode: str = "table", g_values: Iterable[int] | None = None, **model_kw) -> dict:
    """Speedup as acceptance -> 1: max over g of g / cost(g); returns {"speedup", "g"}."""
    b = speedup_bound(union, k, [1.0], mode, g_values, **model_kw).iloc[0]
    return {"speedup": float(b["speedup"]), "g": int(b["best_g"])}


def _solve_break_even(g: int, cost: float, tol: float = 1e-10) -> float:
    if cost <= 1:
        return 0.0
    if cost >= g:
        return float("nan")  # never pays, even at a = 1
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(g)) < cost:  # E(g, mid) in plain floats (bootstrap calls this often)
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def break_even(union, k: int, mode: str = "table", g_values: Iterable[int] | None = None, **model_kw) -> dict:
    """Lowest acceptance at which some window g >= 2 gives speedup >= 1.

    Returns {"acceptance", "g", "by_g": {g: acceptance or nan}}: by_g[g] solves E(g, a) = cost(g);
    the overall break-even is the smallest of them. Below it the best choice is g = 1 (speedup 1).
    """
    u = union_model(union, k, mode, **model_kw)
    if g_values is not None:
        u = {g: v for g, v in u.items() if g in {int(x) for x in g_values}}
    by_g = {g: _solve_break_even(g, ug / k) for g, ug in u.items() if g >= 2}
    ok = {g: a for g, a in by_g.items() if not np.isnan(a)}
    if not ok:
        return {"acceptance": float("nan"), "g": None, "by_g": by_g}
    g = min(ok, key=ok.get)
    return {"acceptance": ok[g], "g": g, "by_g": by_g}


def mtp_reference_check(union=None, k: int = REFERENCE_K, claims: Mapping[str, float] | None = None) -> pd.DataFrame:
    """The reference MTP claims recomputed from their own union table under each set of assumptions.

    Rows: assumption, quantity (ceiling, speedup@0.9, speedup@0.8, break_even), value, best_g,
    reference, matches (|value - reference| within the tolerance of its kind, ``tolerance.TOLERANCE``:
    the claims are given to two digits).
    """
    from .tolerance import tolerance

    tol = {q: tolerance("acceptance" if q == "break_even" else "speedup") for q in ("ceiling", "speedup@0.9",
                                                                                    "speedup@0.8", "break_even")}
    u = union_table(REFERENCE_UNION if union is None else union)
    claims = dict(ceiling=1.83, **{"speedup@0.9": 1.30, "speedup@0.8": 1.08}, break_even=0.72) if claims is None else dict(claims)
    s_ls = fit_union_slope(u, k)
    setups = [
        ("best g in table {%s}" % ",".join(map(str, u)), dict(mode="table")),
        ("best g in table, drafting forced (g>=2)", dict(mode="table", min_g=2)),
        ("best g in table without g=2 {%s}" % ",".join(str(g) for g in u if g != 2),
         dict(mode="table", g_values=[g for g in u if g != 2])),
        ("best g = 1..%d, union linearly interpolated" % max(u), dict(mode="interp")),
        ("best g = 1..%d, linear fit s=%.3f (least squares)" % (max(u), s_ls), dict(mode="fit")),
        ("best g = 1..%d, linear fit s=0.58 (reference slope)" % max(u), dict(mode="fit", slope=0.58)),
    ] + [(f"fixed g={g}", dict(mode="table", g_values=[g])) for g in u if g >= 2]
    rows = []
    for name, kw in setups:
        min_g = kw.pop("min_g", 1)
        acc = [1.0, 0.9, 0.8]
        b = speedup_bound(u, k, acc, min_g=min_g, **kw).set_index("acceptance")
        be = break_even(u, k, **kw)
        for q, a in (("ceiling", 1.0), ("speedup@0.9", 0.9), ("speedup@0.8", 0.8)):
            v = float(b.loc[a, "speedup"])
            rows.append(dict(assumption=name, quantity=q, value=v, best_g=int(b.loc[a, "best_g"]),
                             reference=claims.get(q), matches=abs(v - claims[q]) <= tol[q] + 1e-12 if q in claims else None))
        rows.append(dict(assumption=name, quantity="break_even", value=be["acceptance"], best_g=be["g"],
                         reference=claims.get("break_even"),
                         matches=(abs(be["acceptance"] - claims["break_even"]) <= tol["break_even"] + 1e-12) if "break_even" in claims
                         and not np.isnan(be["acceptance"]) else False))
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- over a workload
SEED_G = (1, 2, 3, 8)  # the windows of the seed's union table: MTP rows compare like for like
MTP_QUANTITIES = ("ceiling", "speedup@0.9", "speedup@0.8", "break_even", "break_even@g3", "slope")


def union_ci(traces, g_values: Iterable[int] = SEED_G, phase: str | None = "decode", **ci) -> pd.DataFrame:
    """union(g) (mean over layers) over a workload ({prompt: trace}): g, union, low, high, n_prompts."""
    from .uncertainty import over_prompts

    ks = set()

    def one(tr):
        t = union_by_window(tr, g_values, phase)
        ks.add(t.attrs["k"])
        return t[t["scope"] == "mean"][["g", "union"]]

    out = over_prompts(traces, one, ["g"], "union", **ci)
    if len(ks) != 1:
        raise ValueError(f"prompts disagree on top-k ({sorted(ks)}); a workload is one model")
    out.attrs["k"] = ks.pop()
    return out


def _mtp_value(u: dict[int, float], k: int, quantity: str) -> float:
    if quantity == "ceiling":
        return max(g * k / v for g, v in u.items())
    if quantity.startswith("speedup@"):
        a = float(quantity.split("@")[1])
        return max(float(expected_tokens(a, g)) * k / v for g, v in u.items())
    if quantity == "break_even":
        return break_even(u, k)["acceptance"]
    if quantity.startswith("break_even@g"):  # one window, like for like with a document's per-window value
        return break_even(u, k, g_values=[int(quantity[len("break_even@g"):])])["acceptance"]
    if quantity == "slope":
        return fit_union_slope(u, k)
    raise ValueError(f"unknown MTP quantity {quantity!r}; known: {MTP_QUANTITIES}")


def mtp_ci(union: pd.DataFrame, quantities: Iterable[str] = MTP_QUANTITIES, **ci) -> pd.DataFrame:
    """The MTP bound quantities from a ``union_ci`` table, bootstrapped over prompts (each resample
    averages the prompts' union tables, then computes the bound over the measured g only):
    quantity, value, low, high, n_prompts, g_values."""
    from .uncertainty import bootstrap_ci, per_prompt

    per = per_prompt(union).pivot(index="prompt", columns="g", values="union").dropna()
    gs, k = [int(g) for g in per.columns], int(union.attrs["k"])
    m = per.to_numpy()
    rows = []
    for q in quantities:
        iv = bootstrap_ci(m, stat=lambda x, q=q: _mtp_value(dict(zip(gs, x.mean(axis=0))), k, q), **ci)
        rows.append(dict(quantity=q, value=iv.estimate, low=iv.low, high=iv.high, n_prompts=iv.n,
                         g_values=",".join(map(str, gs))))
    return pd.DataFrame(rows)


def slope_fits(union, k: int) -> dict[str, float]:
    """Three ways to read one slope s off a union table, and what the seed's own s predicts:
    least squares through (1, k), least squares with a free intercept, mean of per-point slopes."""
    u = union_table(union)
    x = np.array([g - 1 for g in u], float)
    y = np.array([u[g] / k - 1 for g in u], float)
    free = np.polyfit(x, y, 1)[0] if len(x) > 1 else np.nan
    per = [yy / xx for xx, yy in zip(x, y) if xx > 0]
    return {"through_k": fit_union_slope(u, k), "free_intercept": float(free), "mean_per_point": float(np.mean(per))}
