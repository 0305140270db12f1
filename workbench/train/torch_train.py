"""Torch training loop for the reference MoE and its dense draft (GPU machine only).

Needs the ``train`` extra (torch, transformers 5, tokenizers, safetensors). Models are Hugging
Face ``Qwen3MoeForCausalLM`` (default grouped_mm experts) and ``Qwen3ForCausalLM``, held in bf16
with fp32 master weights in the optimizer. The router is trained with a per-layer Switch-style
load-balancing loss (coefficient ``router_aux_loss_coef``) so that every layer uses its experts.

Schedule: linear warm-up, constant, then linear decay over the last ``decay_frac`` of the steps
(warmup-stable-decay). A checkpoint of the last constant-rate step (``ckpt_stable.pt``) lets a
later command continue with more steps and decay again; ``ckpt_last.pt`` is the final state.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .configs import DRAFT_SHAPE, MOE_SHAPE, hf_kwargs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: only for dry runs of the code


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


@dataclass
class TrainArgs:
    batch: int = 128
    seq: int = 512
    steps: int = 0  # 0: chosen from train_seconds after the first timed steps
    train_seconds: float = 480.0
    warmup: int = 100
    decay_frac: float = 0.2
    final_lr_frac: float = 0.02
    lr: float = 2e-3
    draft_lr: float = 3e-3
    weight_decay: float = 0.1
    clip: float = 1.0
    aux_coef: float = 0.01
    draft_every: int = 4
    log_every: int = 50
    seed: int = 1234
    calib_steps: int = 30


def build_models(device: str | None = None, seed: int = 1234):
    device = device or DEVICE
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    mcfg = Qwen3MoeConfig(**hf_kwargs(MOE_SHAPE))
    moe = Qwen3MoeForCausalLM(mcfg)
    dcfg = Qwen3Config(**hf_kwargs(DRAFT_SHAPE))
    draft = Qwen3ForCausalLM(dcfg)
    for m, shape in ((moe, MOE_SHAPE), (draft, DRAFT_SHAPE)):
        assert m.config.vocab_size == shape["vocab_size"]
        assert m.lm_head.weight is m.model.embed_tokens.weight, "embeddings must be tied"
    assert moe.config.num_experts == MOE_SHAPE["num_experts"], moe.config
    assert moe.config.num_experts_per_tok == MOE_SHAPE["num_experts_per_tok"]
    assert moe.config.norm_topk_prob is True
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # bf16 on CPU is very slow
    moe = moe.to(device=device, dtype=dtype)
    draft = draft.to(device=device, dtype=dtype)
    return moe, draft


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


class MasterAdamW:
    """AdamW over fp32 master copies of bf16 model parameters."""

    def __init__(self, model, lr: float, weight_decay: float):
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        decay, no_decay = [], []
        for n, m in zip(self.names, self.master):
            (decay if m.ndim >= 2 and "embed_tokens" not in n else no_decay).append(m)
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=lr,
            betas=(0.9, 0.95),
            eps=1e-8,
            fused=DEVICE == "cuda",
        )

    def step(self, lr: float, clip: float) -> torch.Tensor:
        for m, p in zip(self.master, self.params):
            m.grad = p.grad.float()
            p.grad = None
        norm = torch.nn.utils.clip_grad_norm_(self.master, clip, foreach=True)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.master)
        return norm

    def state_dict(self) -> dict:
        return {"names": self.names, "master": [m.detach() for m in self.master], "opt": self.opt.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        if sd["names"] != self.names:
            raise ValueError("checkpoint parameters differ from the model: start without --resume")
        with torch.no_grad():
            for m, s in zip(self.master, sd["master"]):
                m.copy_(s)
            torch._foreach_copy_(self.params, self.master)
        self.opt.load_state_dict(sd["opt"])


def lr_at(step: int, total: int, a: TrainArgs, peak: float) -> float:
    if step < a.warmup:
        return peak * (step + 1) / a.warmup
    decay_start = int(total * (1 - a.decay_frac))
    if step < decay_start:
        return peak
    frac = (step - decay_start) / max(1, total - decay_start)
    return peak * (1 - frac * (1 - a.final_lr_frac))


def balance_loss(router_logits, top_k: int):
    """Per-layer Switch load-balancing loss (mean over layers) and per-layer slot shares f."""
    lg = torch.stack([r.float() for r in router_logits])  # L, N, E
    L, N, E = lg.shape
    p = lg.softmax(-1)
    idx = p.topk(top_k, dim=-1).indices.reshape(L, -1)
    counts = torch.zeros(L, E, device=lg.device).scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float32))
    f = counts / (N * top_k)
    P = p.mean(1)
    return (E * (f * P).sum(-1)).mean(), f


def sample_batch(tokens: torch.Tensor, batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, tokens.numel() - seq - 1, (batch,), device=tokens.device, generator=gen)
    idx = starts[:, None] + torch.arange(seq + 1, device=tokens.device)[None, :]
    return tokens[idx].long()


def moe_loss(moe, x: torch.Tensor, aux_coef: float):
    out = moe(input_ids=x[:, :-1], use_cache=False, output_router_logits=True)
    V = out.logits.shape[-1]
    ce = F.cross_entropy(out.logits.float().view(-1, V), x[:, 1:].reshape(-1))
    aux, f = balance_loss(out.router_logits, moe.config.num_experts_per_tok)
    return ce + aux_coef * aux, ce, aux, f


def draft_loss(draft, x: torch.Tensor):
    out = draft(input_ids=x[:, :-1], use_cache=False)
    V = out.logits.shape[-1]
    return F.cross_entropy(out.logits.float().view(-1, V), x[:, 1:].reshape(-1))


def bench(tokens: torch.Tensor, batches=(64, 128, 256), seq: int = 512, steps: int = 10) -> list[dict]:
    """Tokens/s of the MoE training step (and the draft step) at a few batch sizes."""
    rows = []
    gen = torch.Generator(device=tokens.device)
    gen.manual_seed(0)
    for b in batches:
        moe, draft = build_models()
        mo, do = MasterAdamW(moe, 1e-3, 0.1), MasterAdamW(draft, 1e-3, 0.1)
        for which, model, opt in (("moe", moe, mo), ("draft", draft, do)):
            for i in range(steps + 3):
                if i == 3:
                    _sync()
                    t0 = time.perf_counter()
                x = sample_batch(tokens, b, seq, gen)
                loss = moe_loss(model, x, 0.01)[0] if which == "moe" else draft_loss(model, x)
                loss.backward()
                opt.step(1e-3, 1.0)
            _sync()
            dt = time.perf_counter() - t0
            rows.append({"model": which, "batch": b, "seq": seq, "step_s": dt / steps, "tokens_per_s": b * seq * steps / dt,
                         "max_mem_gb": torch.cuda.max_memory_allocated() / 1e9 if DEVICE == "cuda" else None})
            print(json.dumps(rows[-1]), flush=True)
        del moe, draft, mo, do
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    return rows


def save_ckpt(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def train(tokens: torch.Tensor, a: TrainArgs, ckpt_dir: Path, log_path: Path, resume: Path | None = None,
          deadline: float | None = None) -> dict:
    """Train MoE + draft on a GPU token stream. Returns a summary dict (and the models)."""
    moe, draft = build_models(seed=a.seed)
    mo = MasterAdamW(moe, a.lr, a.weight_decay)
    do = MasterAdamW(draft, a.draft_lr, a.weight_decay)
    gen = torch.Generator(device=tokens.device)
    gen.manual_seed(a.seed)
    step, seen, draft_seen, train_s = 0, 0, 0, 0.0
    if resume is not None:
        if not resume.is_file():
            raise ValueError(f"no checkpoint at {resume}: run without --resume first (same machine, still warm)")
        try:  # tensors, numbers, strings and containers only: a checkpoint never runs code
            st = torch.load(resume, map_location=DEVICE, weights_only=True)
        except Exception as e:
            raise ValueError(f"checkpoint {resume} cannot be loaded as plain tensors ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}); start without --resume") from None
        moe.load_state_dict(st["moe"])
        draft.load_state_dict(st["draft"])
        mo.load_state_dict(st["moe_opt"])
        do.load_state_dict(st["draft_opt"])
        gen.set_state(st["gen"].cpu() if hasattr(st["gen"], "cpu") else st["gen"])
        step, seen, draft_seen, train_s = st["step"], st["tokens"], st["draft_tokens"], st["train_seconds"]
        print(f"resumed from {resume} at step {step} ({seen / 1e6:.1f}M tokens)", flush=True)
        if log_path.is_file():  # drop rows of the decay branch this run replaces
            rows = [r for r in log_path.read_text().splitlines() if r.strip() and json.loads(r)["step"] <= step]
            log_path.write_text("".join(r + "\n" for r in rows))
    total = a.steps
    per_step = a.batch * a.seq
    moe.train()
    draft.train()
    log = open(log_path, "a")
    acc = torch.zeros(4, device=DEVICE)  # ce, aux, draft ce, n_draft
    acc_n = 0
    f_max = torch.zeros((), device=DEVICE)
    t_start = time.perf_counter()
    t_log = t_start
    calib_t0 = None
    stable_saved = False
    last_row = {}
    local = 0  # steps taken in this command
    while True:
        if total and step >= total:
            break
        if not total and calib_t0 is not None and local - 5 >= a.calib_steps:
            _sync()
            rate = (local - 5) / (time.perf_counter() - calib_t0)
            remaining = a.train_seconds - (time.perf_counter() - t_start)
            total = step + int(rate * remaining * 0.97)
            print(f"auto steps: {rate:.2f} steps/s -> total {total} steps", flush=True)
        if local == 5 and calib_t0 is None:
            _sync()
            calib_t0 = time.perf_counter()
        sched_total = total or 10**9
        if total and not stable_saved and step == int(total * (1 - a.decay_frac)):
            save_ckpt(ckpt_dir / "ckpt_stable.pt", _state(moe, draft, mo, do, gen, step, seen, draft_seen,
                                                          train_s + time.perf_counter() - t_start, a))
            stable_saved = True
        x = sample_batch(tokens, a.batch, a.seq, gen)
        loss, ce, aux, f = moe_loss(moe, x, a.aux_coef)
        loss.backward()
        gn = mo.step(lr_at(step, sched_total, a, a.lr), a.clip)
        acc[0] += ce.detach()
        acc[1] += aux.detach()
        f_max = torch.maximum(f_max, f.max().detach())
        if step % a.draft_every == 0:
            dl = draft_loss(draft, x)
            dl.backward()
            do.step(lr_at(step, sched_total, a, a.draft_lr), a.clip)
            acc[2] += dl.detach()
            acc[3] += 1
            draft_seen += per_step
        acc_n += 1
        step += 1
        local += 1
        seen += per_step
        if step % a.log_every == 0 or step == total:
            v = acc.tolist()
            now = time.perf_counter()
            row = {
                "step": step, "total": total, "tokens": seen, "draft_tokens": draft_seen,
                "elapsed_s": round(train_s + now - t_start, 2),
                "tokens_per_s": round(acc_n * per_step / (now - t_log), 1),
                "ce": v[0] / acc_n, "aux": v[1] / acc_n, "draft_ce": v[2] / max(1, v[3]),
                "lr": lr_at(step - 1, sched_total, a, a.lr), "grad_norm": float(gn),
                "max_slot_share": float(f_max),
            }
            print(json.dumps(row), flush=True)
            log.write(json.dumps(row) + "\n")
            log.flush()
            last_row = row
            acc.zero_()
            acc_n = 0
            f_max.zero_()
            t_log = now
        if deadline is not None and time.time() > deadline:
            print("deadline reached: stopping early", flush=True)
            break
    _sync()
    run_s = time.perf_counter() - t_start
    train_s += run_s
    save_ckpt(ckpt_dir / "ckpt_last.pt", _state(moe, draft, mo, do, gen, step, seen, draft_seen, train_s, a))
    log.close()
    summary = {"steps": step, "planned_steps": total, "tokens": seen, "draft_tokens": draft_seen,
               "train_seconds": train_s, "run_seconds": run_s, "run_steps": local,
               "tokens_per_s": local * per_step / run_s,
               "last_log": last_row, "args": asdict(a),
               "moe_params": n_params(moe), "draft_params": n_params(draft)}
    return {"summary": summary, "moe": moe, "draft": draft}


def _state(moe, draft, mo, do, gen, step, seen, draft_seen, train_s, a):
    return {"moe": moe.state_dict(), "draft": draft.state_dict(), "moe_opt": mo.state_dict(),
            "draft_opt": do.state_dict(), "gen": gen.get_state(), "step": step, "tokens": seen,
            "draft_tokens": draft_seen, "train_seconds": train_s, "args": asdict(a)}


# ---------------------------------------------------------------- evaluation (bf16, on the GPU)


@torch.no_grad()
def evaluate(moe, draft, tok, records: list[dict], seq: int = 512) -> dict:
    """Token-weighted mean NLL of MoE and draft, greedy agreement, per-layer routing stats."""
    moe.eval()
    draft.eval()
    E, k = moe.config.num_experts, moe.config.num_experts_per_tok
    nll_m = nll_d = 0.0
    n_tok = agree = 0
    counts = torch.zeros(moe.config.num_hidden_layers, E, device=DEVICE)
    for r in records:
        ids = tok.encode(r["text"], add_special_tokens=False).ids[:seq]
        if len(ids) < 2:
            continue
        x = torch.tensor([ids], device=DEVICE)
        om = moe(input_ids=x, use_cache=False, output_router_logits=True)
        od = draft(input_ids=x, use_cache=False)
        tgt = x[0, 1:]
        lm, ld = om.logits[0, :-1].float(), od.logits[0, :-1].float()
        nll_m += F.cross_entropy(lm, tgt, reduction="sum").item()
        nll_d += F.cross_entropy(ld, tgt, reduction="sum").item()
        agree += (lm.argmax(-1) == ld.argmax(-1)).sum().item()
        n_tok += tgt.numel()
        for li, rl in enumerate(om.router_logits):
            idx = rl.float().softmax(-1).topk(k, -1).indices.reshape(-1)
            counts[li] += torch.bincount(idx, minlength=E).float()
    share = counts / counts.sum(1, keepdim=True)
    ent = -(share * share.clamp_min(1e-12).log2()).sum(1)
    moe.train()
    draft.train()
    return {
        "n_records": len(records), "n_tokens": n_tok,
        "moe_loss": nll_m / n_tok, "moe_ppl": math.exp(nll_m / n_tok),
        "draft_loss": nll_d / n_tok, "draft_ppl": math.exp(nll_d / n_tok),
        "greedy_agreement": agree / n_tok,
        "routing_usage_entropy_bits": [round(v, 4) for v in ent.tolist()],
        "busiest_expert_slot_share": [round(v, 5) for v in share.max(1).values.tolist()],
    }


# ---------------------------------------------------------------- compact export


def _int8_rows(w: torch.Tensor):
    w = w.float()
    scale = w.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / 127.0
    q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
    return q.contiguous().cpu(), scale.squeeze(-1).contiguous().cpu()


def export_compact(moe, draft, out_dir: Path, layers_per_file: int = 4) -> list[str]:
    """Write the trained weights small enough to come back from the GPU machine.

    Routed-expert matrices: int8 per output row with a float32 scale, under mlx-lm names
    (``model.layers.L.mlp.switch_mlp.{gate,up,down}_proj.{q,scale}``), split over files of
    ``layers_per_file`` layers. Everything else: float16 under the Hugging Face names, which
    are the mlx-lm names for these tensors (``moe_dense.safetensors``, ``draft.safetensors``).
    """
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    sd = moe.state_dict()
    I = moe.config.moe_intermediate_size
    L = moe.config.num_hidden_layers
    written = []
    dense = {}
    experts: dict[int, dict[str, torch.Tensor]] = {l: {} for l in range(L)}
    per_expert: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    for name, t in sd.items():
        if name == "lm_head.weight":
            continue  # tied
        if ".mlp.experts." not in name:
            dense[name] = t.detach().to(torch.float16).contiguous().cpu()
            continue
        l = int(name.split(".")[2])
        pre = f"model.layers.{l}.mlp.switch_mlp"
        if name.endswith("experts.gate_up_proj"):  # (E, 2I, H): first I rows gate, next I up
            for part, w in (("gate_proj", t[:, :I, :]), ("up_proj", t[:, I:, :])):
                q, s = _int8_rows(w)
                experts[l][f"{pre}.{part}.q"], experts[l][f"{pre}.{part}.scale"] = q, s
        elif name.endswith("experts.down_proj"):  # (E, H, I)
            q, s = _int8_rows(t)
            experts[l][f"{pre}.down_proj.q"], experts[l][f"{pre}.down_proj.scale"] = q, s
        elif name.endswith((".gate_proj.weight", ".up_proj.weight", ".down_proj.weight")):
            # older per-expert layout: model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight
            part = name.split(".")[-2]
            per_expert.setdefault((l, part), {})[int(name.split(".")[5])] = t
        else:
            raise ValueError(f"unexpected expert tensor {name}: transformers layout changed")
    for (l, part), d in sorted(per_expert.items()):
        q, s = _int8_rows(torch.stack([d[e] for e in range(len(d))]))
        pre = f"model.layers.{l}.mlp.switch_mlp"
        experts[l][f"{pre}.{part}.q"], experts[l][f"{pre}.{part}.scale"] = q, s
    for l in range(L):
        if len(experts[l]) != 6:
            raise ValueError(f"layer {l}: expected 6 expert tensors, found {sorted(experts[l])}")
    for lo in range(0, L, layers_per_file):
        hi = min(L, lo + layers_per_file) - 1
        part = {}
        for l in range(lo, hi + 1):
            part.update(experts[l])
        fn = f"experts_{lo:02d}-{hi:02d}.safetensors"
        save_file(part, str(out_dir / fn), metadata={"format": "int8_rows"})
        written.append(fn)
    save_file(dense, str(out_dir / "moe_dense.safetensors"), metadata={"format": "fp16"})
    written.append("moe_dense.safetensors")
    dd = {n: t.detach().to(torch.float16).contiguous().cpu() for n, t in draft.state_dict().items() if n != "lm_head.weight"}
    save_file(dd, str(out_dir / "draft.safetensors"), metadata={"format": "fp16"})
    written.append("draft.safetensors")
    return written
