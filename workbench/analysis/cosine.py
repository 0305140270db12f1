"""Expert cosine analysis per layer (DESIGN section 4).

For each layer, flatten every expert (all its tensors, e.g. gate/up/down, concatenated) into a
row of the E x P matrix M. Everything is computed from the E x E Gram matrix G = M M^T, built in
chunks so a 4-bit model is dequantized a slice at a time (never the whole E x P matrix at once):

- pairwise cosine cos_ij = G_ij / sqrt(G_ii G_jj): its distribution and mean over pairs i < j;
- norm share left after subtracting the layer mean expert m:
  ``resid_energy_share = sum_i ||x_i - m||^2 / sum_i ||x_i||^2`` and ``resid_norm_share`` its
  square root (a Frobenius-norm ratio); per-expert ``resid_norm_share_expert`` (mean of
  ||x_i - m|| / ||x_i||) as well;
- singular-value energy curve of M (sigma_r^2 are the eigenvalues of G): cumulative energy share
  by rank, and the rank needed for a chosen share.

Identity used by the claims ledger: with equal expert norms and mean pairwise cosine c over E
experts, the mean expert carries exactly (1 + (E-1) c) / E of the energy, so the residual energy
share is 1 - (1 + (E-1) c) / E (see ``residual_share_from_cosine``).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from ..families import expert_module, moe_blocks
from ._common import QuantizedTensor, leading_dim, to_numpy


class Grams(dict):
    """{layer: E x E float64 Gram matrix}; pass it instead of weights to skip recomputing."""


def experts_from_model(model) -> dict[int, dict[str, object]]:
    """{layer: {"gate_proj": t, "up_proj": t, "down_proj": t}} from a loaded mlx-lm MoE model.

    Quantized projections come back as QuantizedTensor (dequantized lazily, in chunks). Only the
    projection weights are compared (expert biases, e.g. gpt-oss, are left out).
    """
    out = {}
    for i, blk in moe_blocks(model).items():
        sw = expert_module(blk)
        tensors = {}
        for name in ("gate_proj", "up_proj", "down_proj", "fc1", "fc2"):
            proj = getattr(sw, name, None)
            if proj is None:
                continue
            if hasattr(proj, "scales"):
                tensors[name] = QuantizedTensor(proj.weight, proj.scales, getattr(proj, "biases", None),
                                                proj.group_size, proj.bits, getattr(proj, "mode", "affine"))
            else:
                tensors[name] = proj.weight
        out[i] = tensors
    return out


def _tensors(layer_value) -> list:
    if isinstance(layer_value, Mapping) and "scales" not in layer_value:
        return list(layer_value.values())
    if isinstance(layer_value, (list, tuple)) and layer_value and not hasattr(layer_value[0], "shape"):
        return list(layer_value)
    if isinstance(layer_value, (list, tuple)):  # list of per-expert arrays
        return [np.stack([np.asarray(v, np.float32) for v in layer_value])]
    return [layer_value]


def _chunks(t, max_elems: int):
    """Yield float32 [E, p] column blocks of one expert tensor, slicing along axis 1."""
    if isinstance(t, dict) and "scales" in t:
        t = QuantizedTensor(**{k: v for k, v in t.items() if k in QuantizedTensor.__dataclass_fields__})
    e = leading_dim(t)
    shape = t.weight.shape if isinstance(t, QuantizedTensor) else t.shape
    if len(shape) == 1:
        yield to_numpy(t).reshape(e, 1)
        return
    rows = int(shape[1])
    per_row = max(1, int(np.prod(shape[2:])) if len(shape) > 2 else 1)
    if isinstance(t, QuantizedTensor):
        per_row *= 32 // t.bits
    step = max(1, max_elems // max(1, e * per_row))
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        if isinstance(t, QuantizedTensor):
            sub = QuantizedTensor(t.weight[:, r0:r1], t.scales[:, r0:r1],
                                  None if t.biases is None else t.biases[:, r0:r1], t.group_size, t.bits, t.mode)
            block = sub.dequantize()
        else:
            block = to_numpy(t[:, r0:r1])
        yield block.reshape(e, -1)


def expert_gram(layer_value, max_chunk_elems: int = 1 << 24) -> np.ndarray:
    """E x E Gram matrix (float64) of one layer's flattened experts."""
    g = None
    e = None
    for t in _tensors(layer_value):
        te = leading_dim(t)
        if e is None:
            e = te
        elif te != e:
            raise ValueError(f"expert tensors of one layer disagree on the expert count ({e} vs {te})")
        for block in _chunks(t, max_chunk_elems):
            gb = block @ block.T
            g = gb.astype(np.float64) if g is None else g + gb
    if g is None:
        raise ValueError("no expert tensors given for a layer")
    return g


def expert_grams(experts: Mapping[int, object], progress: bool = False) -> Grams:
    """{layer: Gram} for {layer: expert tensors} (array [E, ...], QuantizedTensor, or dict of them)."""
    if isinstance(experts, Grams):
        return experts
    if not experts:
        raise ValueError("no layers given; pass {layer: expert weights [E, ...]} or experts_from_model(model)")
    items = list(experts.items())
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(items, desc="expert gram", unit="layer")
    return Grams({int(l): expert_gram(v) for l, v in items})


def _cos(g: np.ndarray) -> np.ndarray:
    n = np.sqrt(np.clip(np.diag(g), 0, None))
    with np.errstate(invalid="ignore", divide="ignore"):
        c = g / np.outer(n, n)
    c[np.outer(n, n) == 0] = np.nan
    return np.clip(c, -1.0, 1.0)


def cosine_pairs(experts) -> pd.DataFrame:
    """One row per expert pair i < j per layer: layer, i, j, cosine."""
    grams = expert_grams(experts)
    frames = []
    for l, g in grams.items():
        c = _cos(g)
        i, j = np.triu_indices(len(g), k=1)
        frames.append(pd.DataFrame({"layer": l, "i": i.astype(np.int32), "j": j.astype(np.int32), "cosine": c[i, j]}))
    return pd.concat(frames, ignore_index=True)


def _eig_desc(g: np.ndarray) -> np.ndarray:
    ev = np.linalg.eigvalsh((g + g.T) / 2)[::-1]
    return np.clip(ev, 0, None)


def _center(g: np.ndarray) -> np.ndarray:
    e = len(g)
    h = np.eye(e) - 1.0 / e
    return h @ g @ h


def energy_curve(experts, center: bool = False) -> pd.DataFrame:
    """Cumulative singular-value energy share by rank: layer, rank (1..E), energy_share, sigma."""
    grams = expert_grams(experts)
    frames = []
    for l, g in grams.items():
        ev = _eig_desc(_center(g) if center else g)
        tot = ev.sum()
        cum = np.cumsum(ev) / tot if tot > 0 else np.full(len(ev), np.nan)
        frames.append(pd.DataFrame({"layer": l, "rank": np.arange(1, len(ev) + 1), "energy_share": cum,
                                    "sigma": np.sqrt(ev), "centered": center}))
    return pd.concat(frames, ignore_index=True)


def rank_for_share(energy_share: np.ndarray, share: float) -> int:
    """Smallest rank whose cumulative energy share reaches ``share``."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}")
    hits = np.nonzero(np.asarray(energy_share) >= share - 1e-12)[0]
    return int(hits[0] + 1) if len(hits) else len(energy_share)


def cosine_summary(experts, share: float = 0.9, at_rank: int | None = None, center: bool = False) -> pd.DataFrame:
    """Per layer: mean/median/min/max pairwise cosine, residual norm/energy share after subtracting
    the layer mean expert, rank for ``share`` of the energy, energy share at ``at_rank`` (default E/2)."""
    grams = expert_grams(experts)
    rows = []
    for l, g in grams.items():
        e = len(g)
        c = _cos(g)
        iu = np.triu_indices(e, k=1)
        pc = c[iu]
        tot = float(np.trace(g))
        resid = tot - float(g.sum()) / e
        diag = np.diag(g)
        per = diag - 2.0 * g.sum(axis=1) / e + float(g.sum()) / e**2
        with np.errstate(invalid="ignore", divide="ignore"):
            per_share = np.sqrt(np.clip(per, 0, None) / diag)
        ev = _eig_desc(_center(g) if center else g)
        cum = np.cumsum(ev) / ev.sum() if ev.sum() > 0 else np.full(e, np.nan)
        r = at_rank if at_rank is not None else max(1, e // 2)
        rows.append(dict(
            layer=l, n_experts=e,
            mean_cosine=float(np.nanmean(pc)) if len(pc) else np.nan,
            median_cosine=float(np.nanmedian(pc)) if len(pc) else np.nan,
            min_cosine=float(np.nanmin(pc)) if len(pc) else np.nan,
            max_cosine=float(np.nanmax(pc)) if len(pc) else np.nan,
            resid_energy_share=resid / tot if tot > 0 else np.nan,
            resid_norm_share=float(np.sqrt(max(resid, 0) / tot)) if tot > 0 else np.nan,
            resid_norm_share_expert=float(np.nanmean(per_share)),
            share=share, rank_for_share=rank_for_share(cum, share),
            at_rank=min(r, e), energy_at_rank=float(cum[min(r, e) - 1]), centered=center,
        ))
    return pd.DataFrame(rows)


def residual_share_from_cosine(mean_cosine: float, n_experts: int) -> dict:
    """What mean pairwise cosine c implies for equal-norm experts: energy and norm share left
    after subtracting the mean expert (exact identity for equal norms)."""
    e = n_experts
    removed = (1 + (e - 1) * mean_cosine) / e
    return {"resid_energy_share": 1 - removed, "resid_norm_share": float(np.sqrt(max(0.0, 1 - removed)))}


def cosine_histogram(pairs: pd.DataFrame, bins: int | Iterable[float] = 40) -> pd.DataFrame:
    """Binned pair counts per layer (layer, bin_lo, bin_hi, count, share): small enough to chart."""
    vals = pairs["cosine"].dropna().to_numpy()
    if isinstance(bins, int):
        lo, hi = (float(vals.min()), float(vals.max())) if len(vals) else (-1.0, 1.0)
        if hi - lo < 1e-9:
            lo, hi = lo - 0.01, hi + 0.01
        edges = np.linspace(lo, hi, bins + 1)
    else:
        edges = np.asarray(list(bins), float)
    frames = []
    for l, grp in pairs.groupby("layer"):
        cnt, _ = np.histogram(grp["cosine"].dropna(), bins=edges)
        frames.append(pd.DataFrame({"layer": l, "bin_lo": edges[:-1], "bin_hi": edges[1:], "count": cnt,
                                    "share": cnt / max(1, cnt.sum())}))
    return pd.concat(frames, ignore_index=True)


COSINE_QUANTITIES = ("mean_cosine", "resid_norm_share", "energy_at_rank")


def cosine_ci(summary: pd.DataFrame, quantities: Iterable[str] = COSINE_QUANTITIES, **ci) -> pd.DataFrame:
    """Mean over layers of each ``cosine_summary`` quantity with a bootstrap interval over layers
    (weights do not vary by prompt; the layer is the resampled unit): quantity, value, low, high, n_layers."""
    from .uncertainty import interval_table

    long = summary.melt(id_vars=["layer"], value_vars=list(quantities), var_name="quantity", value_name="value")
    return interval_table(long.rename(columns={"layer": "prompt"}), ["quantity"], "value", unit="layer", **ci)


def cosine_for_norm_share(norm_share: float, n_experts: int, energy: bool = False) -> float:
    """Mean pairwise cosine that leaves ``norm_share`` of the norm (or of the energy, ``energy=True``)
    after subtracting the mean of ``n_experts`` equal-norm experts: c = 1 - r^2 E / (E - 1)."""
    e = n_experts
    r2 = norm_share if energy else norm_share ** 2
    return 1 - r2 * e / (e - 1)
