"""Predictor calibration (DESIGN section 4, issue 5 item 5).

A trace row (token, layer) may carry predictor candidates ``pred_<src>`` (expert ids, best
first) for that row's layer; a candidate is *claimed* if the real router selected it
(``selected`` of the same row).

- ``candidate_table``: one row per candidate (token, layer, source, rank, expert, claimed).
- ``precision_table``: precision (claimed share) by source / rank / layer, with Wilson 95% bounds.
- ``fit_claim_model``: q = P(claimed | source, rank, layer), trained on one trace:
    "binned": shrunk frequencies, (source, rank, layer) shrunk toward (source, rank), shrunk
    toward the source's rate (prior strength m pseudo-counts at each level);
    "logistic": L2 logistic regression on source, source x log(rank), layer (one-hot).
- ``reliability_table`` / ``calibration_scores``: predicted q bins vs observed frequency, Brier
  score, log loss and expected calibration error on a held-out trace.

The fitted ``ClaimModel.q(source, rank, layer)`` is the ``q_e`` of the admission cost test
``q_e * stall_saved > price * bytes_e + victim_loss``; ``to_json`` / ``from_json`` carry it to
the engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from ._common import as_trace, membership, phase_rows, ragged_sets, require_columns


def pred_sources(trace) -> list[str]:
    """Predictor sources recorded in a trace (columns pred_<src>)."""
    tr = as_trace(trace)
    return [c[len("pred_"):] for c in tr.routes.columns if c.startswith("pred_")]


def candidate_table(trace, sources: Iterable[str] | None = None, phase: str | None = "decode",
                    max_rank: int | None = None) -> pd.DataFrame:
    """Long table of predicted candidates: step, token, layer, source, rank (1 = best), expert, claimed."""
    tr = as_trace(trace)
    rows = phase_rows(tr, phase)
    srcs = pred_sources(tr) if sources is None else list(sources)
    if not srcs:
        raise ValueError("trace has no pred_<source> columns; record a run with a predictor on")
    require_columns(rows, ["selected"] + [f"pred_{s}" for s in srcs], "predictor calibration")
    rows = rows.reset_index(drop=True)
    sel = ragged_sets(rows["selected"])
    n_exp = int(tr.meta.get("n_experts") or 1 + max(
        [int(s.max()) for s in sel if len(s)] + [int(max(v)) for s in srcs for v in rows[f"pred_{s}"] if v is not None and len(v)]))
    width = max((len(s) for s in sel), default=1)
    padded = np.full((len(sel), width), -1, np.int64)
    for i, s in enumerate(sel):
        padded[i, :len(s)] = s
    sel_mask = membership(padded, n_exp)
    frames = []
    for s in srcs:
        preds = ragged_sets(rows[f"pred_{s}"])
        lens = np.array([len(p) for p in preds])
        if max_rank is not None:
            preds = [p[:max_rank] for p in preds]
            lens = np.minimum(lens, max_rank)
        if lens.sum() == 0:
            continue
        ri = np.repeat(np.arange(len(preds)), lens)
        rank = np.concatenate([np.arange(1, n + 1) for n in lens if n])
        expert = np.concatenate([p for p in preds if len(p)])
        if expert.max() >= n_exp or expert.min() < 0:
            raise ValueError(f"pred_{s} holds expert id {int(expert.max())} outside 0..{n_exp - 1}")
        frames.append(pd.DataFrame({
            "step": rows["step"].to_numpy()[ri], "token": rows["token"].to_numpy()[ri],
            "layer": rows["layer"].to_numpy()[ri].astype(np.int64), "source": s,
            "rank": rank.astype(np.int64), "expert": expert, "claimed": sel_mask[ri, expert]}))
    if not frames:
        raise ValueError(f"pred_ columns {srcs} are empty in every {phase} row")
    return pd.concat(frames, ignore_index=True)


def _wilson(c, n, z=1.96):
    c, n = np.asarray(c, float), np.asarray(n, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = c / n
        d = 1 + z * z / n
        mid = (p + z * z / (2 * n)) / d
        half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return mid - half, mid + half


def precision_table(cands: pd.DataFrame, by: Sequence[str] = ("source", "rank")) -> pd.DataFrame:
    """Precision of candidates grouped by ``by`` (any of source, rank, layer): n, claimed, precision, ci_lo, ci_hi."""
    by = list(by)
    bad = [b for b in by if b not in cands.columns]
    if bad:
        raise ValueError(f"cannot group by {bad}; candidate columns are {list(cands.columns)}")
    g = cands.groupby(by, sort=True)["claimed"].agg(["size", "sum"]).reset_index()
    g = g.rename(columns={"size": "n", "sum": "claimed"})
    g["precision"] = g["claimed"] / g["n"]
    g["ci_lo"], g["ci_hi"] = _wilson(g["claimed"], g["n"])
    return g


@dataclass
class ClaimModel:
    """P(candidate is claimed | source, rank, layer); ``q()`` for one candidate, ``predict()`` for a table."""

    method: str
    sources: list[str]
    max_rank: int
    layers: list[int]
    params: dict = field(default_factory=dict)

    # ---- binned
    def _binned(self, src, rank, layer):
        p = self.params
        rank = np.minimum(np.asarray(rank, np.int64), self.max_rank)
        s = pd.Series(np.asarray(src), dtype=str)
        unknown = set(s.unique()) - set(p["s"])
        if unknown:
            raise ValueError(f"sources {sorted(unknown)} were not in the training trace (known: {self.sources})")
        sr = s + "|" + pd.Series(rank).astype(str)
        srl = sr + "|" + pd.Series(np.asarray(layer, np.int64)).astype(str)
        out = srl.map(p["srl"])
        out = out.fillna(sr.map(p["sr"])).fillna(s.map(p["s"]))
        return out.to_numpy(dtype=float)

    # ---- logistic
    def _design(self, src, rank, layer):
        src = np.asarray(src)
        rank = np.minimum(np.asarray(rank, float), self.max_rank)
        unknown = set(np.unique(src)) - set(self.sources)
        if unknown:
            raise ValueError(f"sources {sorted(unknown)} were not in the training trace (known: {self.sources})")
        cols = [np.ones(len(src))]
        for s in self.sources[1:]:
            cols.append((src == s).astype(float))
        for s in self.sources:
            cols.append((src == s) * np.log(rank))
        layer = np.asarray(layer)
        for l in self.layers[1:]:
            cols.append((layer == l).astype(float))
        return np.stack(cols, axis=1)

    def predict(self, cands: pd.DataFrame) -> np.ndarray:
        """q for every row of a candidate table (columns source, rank, layer)."""
        src, rank, layer = cands["source"].to_numpy(), cands["rank"].to_numpy(), cands["layer"].to_numpy()
        if self.method == "binned":
            return self._binned(src, rank, layer)
        z = self._design(src, rank, layer) @ np.asarray(self.params["beta"])
        return 1 / (1 + np.exp(-z))

    def q(self, source: str, rank: int, layer: int) -> float:
        """Probability that the rank-th candidate of ``source`` for ``layer`` is claimed."""
        return float(self.predict(pd.DataFrame({"source": [source], "rank": [rank], "layer": [layer]}))[0])

    def table(self) -> pd.DataFrame:
        """q for every (source, layer, rank) seen in training: the lookup an admission gate needs."""
        s, l, r = np.meshgrid(np.arange(len(self.sources)), self.layers, np.arange(1, self.max_rank + 1), indexing="ij")
        df = pd.DataFrame({"source": np.asarray(self.sources)[s.ravel()], "layer": l.ravel(), "rank": r.ravel()})
        df["q"] = self.predict(df)
        return df

    def gate_table(self, source: str) -> dict:
        """{layer: [q of rank 1 .. max_rank]} of one source: the ``q_table`` of the cost gate
        (``routing.gates.CostGate``); sources: d<D> (layer predictor at distance D), prev."""
        if source not in self.sources:
            raise ValueError(f"the claim model has no source {source!r} (it has {', '.join(self.sources)})")
        t = self.table()
        t = t[t["source"] == source].sort_values(["layer", "rank"])
        return {int(l): g["q"].round(6).tolist() for l, g in t.groupby("layer")}

    def to_json(self) -> str:
        return json.dumps(dict(method=self.method, sources=self.sources, max_rank=self.max_rank,
                               layers=[int(x) for x in self.layers], params=self.params))

    @classmethod
    def from_json(cls, text: str) -> "ClaimModel":
        return cls(**json.loads(text))


def fit_claim_model(cands: pd.DataFrame, method: str = "binned", prior_strength: float = 20.0,
                    l2: float = 1.0, by_layer: bool = True) -> ClaimModel:
    """Fit q = P(claimed | source, rank, layer) on a training candidate table."""
    if cands.empty:
        raise ValueError("no candidates to fit on")
    sources = sorted(cands["source"].unique().tolist())
    max_rank = int(cands["rank"].max())
    layers = sorted(int(x) for x in cands["layer"].unique())
    y = cands["claimed"].to_numpy().astype(float)
    if method == "binned":
        m = float(prior_strength)
        glob = float(y.mean())
        s_tab = cands.groupby("source")["claimed"].agg(["sum", "size"])
        ps = {s: float((r["sum"] + m * glob) / (r["size"] + m)) for s, r in s_tab.iterrows()}
        sr_tab = cands.groupby(["source", "rank"])["claimed"].agg(["sum", "size"])
        psr = {f"{s}|{int(r)}": float((v["sum"] + m * ps[s]) / (v["size"] + m)) for (s, r), v in sr_tab.iterrows()}
        psrl = {}
        if by_layer:
            srl = cands.groupby(["source", "rank", "layer"])["claimed"].agg(["sum", "size"])
            psrl = {f"{s}|{int(r)}|{int(l)}": float((v["sum"] + m * psr[f"{s}|{int(r)}"]) / (v["size"] + m))
                    for (s, r, l), v in srl.iterrows()}
        return ClaimModel("binned", sources, max_rank, layers, {"s": ps, "sr": psr, "srl": psrl, "prior_strength": m})
    if method == "logistic":
        model = ClaimModel("logistic", sources, max_rank, layers if by_layer else layers[:1], {})
        x = model._design(cands["source"].to_numpy(), cands["rank"].to_numpy(), cands["layer"].to_numpy())
        beta = np.zeros(x.shape[1])
        reg = np.full(x.shape[1], l2)
        reg[0] = 0.0  # no penalty on the intercept
        for _ in range(50):  # Newton / IRLS
            p = 1 / (1 + np.exp(-(x @ beta)))
            grad = x.T @ (p - y) + reg * beta
            hess = (x * (p * (1 - p))[:, None]).T @ x + np.diag(reg + 1e-9)
            step = np.linalg.solve(hess, grad)
            beta -= step
            if np.abs(step).max() < 1e-8:
                break
        model.params = {"beta": beta.tolist(), "l2": l2}
        return model
    raise ValueError(f"method must be 'binned' or 'logistic', got {method!r}")


def reliability_table(model: ClaimModel, cands: pd.DataFrame, bins: int = 10, strategy: str = "uniform",
                      by_source: bool = False) -> pd.DataFrame:
    """Reliability diagram rows: [source,] bin, q_lo, q_hi, mean_q, observed, n."""
    q = model.predict(cands)
    y = cands["claimed"].to_numpy().astype(float)
    if strategy == "uniform":
        edges = np.linspace(0, 1, bins + 1)
    elif strategy == "quantile":
        edges = np.unique(np.quantile(q, np.linspace(0, 1, bins + 1)))
        edges[0], edges[-1] = 0.0, 1.0
    else:
        raise ValueError(f"strategy must be 'uniform' or 'quantile', got {strategy!r}")
    b = np.clip(np.searchsorted(edges, q, side="right") - 1, 0, len(edges) - 2)
    df = pd.DataFrame({"source": cands["source"].to_numpy(), "bin": b, "q": q, "y": y})
    keys = ["source", "bin"] if by_source else ["bin"]
    g = df.groupby(keys).agg(mean_q=("q", "mean"), observed=("y", "mean"), n=("y", "size")).reset_index()
    g["q_lo"] = edges[g["bin"].to_numpy()]
    g["q_hi"] = edges[g["bin"].to_numpy() + 1]
    return g[keys + ["q_lo", "q_hi", "mean_q", "observed", "n"]]


def calibration_scores(model: ClaimModel, cands: pd.DataFrame, bins: int = 10) -> pd.DataFrame:
    """Per source and overall ("all"): n, base_rate, mean_q, brier, log_loss, ece (uniform bins)."""
    q = np.clip(model.predict(cands), 1e-9, 1 - 1e-9)
    y = cands["claimed"].to_numpy().astype(float)
    src = cands["source"].to_numpy()
    rows = []
    for name, m in [("all", np.ones(len(y), bool))] + [(s, src == s) for s in sorted(set(src))]:
        qq, yy = q[m], y[m]
        b = np.clip((qq * bins).astype(int), 0, bins - 1)
        ece = sum(abs(qq[b == i].mean() - yy[b == i].mean()) * (b == i).sum() for i in range(bins) if (b == i).any()) / len(yy)
        rows.append(dict(source=name, n=int(len(yy)), base_rate=float(yy.mean()), mean_q=float(qq.mean()),
                         brier=float(((qq - yy) ** 2).mean()),
                         log_loss=float(-(yy * np.log(qq) + (1 - yy) * np.log(1 - qq)).mean()), ece=float(ece)))
    return pd.DataFrame(rows)


def with_predictions(trace, routers, distances: Iterable[int] = (1, 2, 3), prev_token: bool = True,
                     width: int | None = None):
    """A copy of ``trace`` (with ``moe_input``) carrying ``pred_d<d>`` and ``pred_prev`` candidate
    columns computed offline: layer L's router applied to the MoE input of layer L-d (same token)
    or of layer L at the previous token, top ``width`` (default top-k) experts, best first."""
    from ._common import list_column, top_ids
    from .lookahead import as_router
    from ..trace.schema import Trace

    tr = as_trace(trace)
    df = tr.routes.reset_index(drop=True)
    require_columns(df, ["selected", "moe_input"], "offline predictor candidates")
    routers = {int(l): as_router(r) for l, r in routers.items()}
    width = int(width or tr.meta.get("top_k") or len(df["selected"].iloc[0]))
    layers = sorted(int(x) for x in df["layer"].unique())
    pos = {l: i for i, l in enumerate(layers)}
    row_of = {(int(t), int(l)): i for i, (t, l) in enumerate(zip(df["token"], df["layer"]))}
    moe = df["moe_input"].to_numpy()
    sources = [(f"d{d}", lambda t, L, d=d: (t, layers[pos[L] - d]) if pos[L] - d >= 0 else None) for d in distances]
    if prev_token:
        sources.append(("prev", lambda t, L: (t - 1, L)))
    cols = {}
    for name, src in sources:
        out = [None] * len(df)
        for L in layers:
            if L not in routers:
                raise ValueError(f"no router for layer {L}; pass routers_from_model(model)")
            rows = np.nonzero(df["layer"].to_numpy() == L)[0]
            pairs = [(i, row_of.get(src(int(df.at[i, "token"]), L) or (-1, -1))) for i in rows]
            pairs = [(i, j) for i, j in pairs if j is not None]
            if not pairs:
                continue
            x = list_column(pd.Series([moe[j] for _, j in pairs]), np.float32, name="moe_input")
            ids = top_ids(routers[L].scores(x), width)
            for (i, _), p in zip(pairs, ids):
                out[i] = p.astype(np.int16).tolist()
        cols[f"pred_{name}"] = out
    return Trace(routes=df.assign(**cols), meta=dict(tr.meta))


def claim_candidates(trace, routers=None, phase: str | None = "decode") -> pd.DataFrame:
    """The candidates to fit q on: with ``routers`` (and MoE inputs in the trace), predicted
    offline before any mapped expert is removed (``with_predictions``); without, the trace's live
    ``pred_`` columns, which skip experts already mapped (a selection bias: the remaining
    candidates are the harder ones)."""
    tr = as_trace(trace)
    if routers is not None:
        return candidate_table(with_predictions(tr, routers), sources=["d1", "d2", "d3", "prev"], phase=phase)
    return candidate_table(tr, phase=phase)


def _fingerprints(trace) -> set:
    """One hash per routing row: its layer and what the router saw (MoE input, else logits, else
    the step's selections), so the same prompt's rows match and another prompt's do not."""
    df = as_trace(trace).routes
    for col in ("moe_input", "logits"):
        if col in df and df[col].notna().all():
            return {hash((int(l), np.asarray(v, dtype=np.float16).tobytes())) for l, v in zip(df["layer"], df[col])}
    steps = df.groupby("step")["selected"].apply(lambda s: tuple(tuple(int(x) for x in v) for v in s))
    return {hash(v) for v in steps}


def held_out_overlap(fit_trace, eval_trace) -> float:
    """Share of the evaluation trace's routing rows that also occur in the fit trace (0: held out)."""
    fit, ev = _fingerprints(fit_trace), _fingerprints(eval_trace)
    return len(ev & fit) / len(ev) if ev else 0.0


def calibration_ci(model: ClaimModel, cands_by_prompt, **ci) -> pd.DataFrame:
    """Brier score per source (and "all") on held-out candidates ({prompt: candidate_table}),
    with a bootstrap interval over the held-out prompts: source, brier, low, high, n_prompts,
    base_rate, mean_q."""
    from .uncertainty import interval_table

    per = pd.concat([calibration_scores(model, c).assign(prompt=p) for p, c in cands_by_prompt.items()],
                    ignore_index=True)
    out = interval_table(per[["source", "prompt", "brier"]], ["source"], "brier", **ci)
    rest = per.groupby("source")[["base_rate", "mean_q"]].mean()
    return out.join(rest, on="source")


def held_out_calibration(fit_traces, eval_traces, routers, phase: str | None = "decode", bins: int = 10,
                         method: str = "binned", **ci) -> dict:
    """Fit q on ``fit_traces`` ({prompt: trace}) and score it on ``eval_traces`` (other prompts,
    never seen by the fit), candidates from ``with_predictions``. Returns {"model", "scores"
    (calibration_ci), "reliability" (reliability_table by source on the pooled held-out candidates)}."""
    overlap = set(fit_traces) & set(eval_traces)
    if overlap:
        raise ValueError(f"prompts {sorted(overlap)[:3]} are in both the fit and the held-out set")
    cands = lambda trs: {p: claim_candidates(t, routers, phase) for p, t in trs.items()}
    fit = cands(fit_traces)
    model = fit_claim_model(pd.concat(list(fit.values()), ignore_index=True), method=method)
    held = cands(eval_traces)
    pooled = pd.concat(list(held.values()), ignore_index=True)
    return {"model": model, "scores": calibration_ci(model, held, **ci),
            "reliability": reliability_table(model, pooled, bins=bins, by_source=True)}
