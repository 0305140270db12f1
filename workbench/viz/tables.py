"""A run's counters as aligned text (``workbench run`` prints these; notebooks too)."""

from __future__ import annotations


def aligned(rows) -> str:
    """(label, text) rows as two aligned columns."""
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def speculative_table(s: dict) -> str:
    sp = s["speculative"]
    rows = [
        ("draft tokens", f"{sp['num_draft_tokens']} per pass, {sp['verify_passes']} verify passes, "
                         f"{sp['tokens_per_pass']:.2f} tokens per pass"),
        ("acceptance", f"{sp['accepted']} / {sp['drafted']} drafted tokens ({sp['acceptance']:.1%})"),
        ("per verify pass", f"{sp['union_experts_per_pass']:.1f} experts claimed (union over the pass; "
                            f"{sp['experts_per_plain_token']} per plain token), {sp['experts_read_per_pass']:.1f} read, "
                            f"{sp['bytes_read_per_pass'] / 1e6:.3f} MB"),
        ("draft / verify", f"{sp['draft_s']:.3f} s / {sp['verify_s']:.3f} s"),
    ]
    if "plain" in sp:
        pl = sp["plain"]
        rows.append(("vs plain streaming", f"{s['tokens_per_s']:.2f} vs {pl['tokens_per_s']:.2f} tokens/s "
                                           f"({pl['speedup']:.2f}x, one run each), {s['bytes_per_token'] / 1e6:.3f} vs "
                                           f"{pl['bytes_per_token'] / 1e6:.3f} MB/token"))
    return aligned(rows)


def share(n: int, total: int) -> str:
    return f"{n} ({n / total:.1%})" if total else str(n)


def summary_table(s: dict) -> str:
    """The streaming counters in plain words. Every expert a layer needs is one lookup, served from the
    arena, by a read-ahead, or read on demand (the three add up to the lookups; the hit rate is the
    first two over the lookups). No tokens/s here: mlx-lm's "Generation" line is the one figure."""
    pf, n = s["prefetch"], s["tokens"]
    lookups, pre = s["lookups"], s["prefill"]
    rows = [
        ("arena", f"{s['arena_slots']} of {s['routed_experts']} routed experts ({s['expert_bytes'] / 1e6:.3f} MB each)"),
        ("expert lookups", f"{lookups} over {n} tokens ({lookups / max(1, n):.1f} per token)"),
        ("  from the arena", share(s["hits"], lookups)),
        ("  by read-ahead", share(s["prefetch_hits"], lookups)),
        ("  read on demand", share(s["misses"], lookups) + ", each waited for"),
        ("hit rate", f"{s['hit_rate']:.1%} (arena + read-ahead), {s['evictions']} evictions"),
        ("bytes read", f"{s['bytes_read'] / 1e6:.2f} MB ({s['bytes_per_token'] / 1e6:.3f} MB per token)"
                       + (f", {s['prefetch_bytes']['issued'] / 1e6:.2f} MB of it by read-ahead" if pf["issued"] else "")),
        ("page cache", "n/a (reads bypass the page cache)" if s["page_cache_hits"] is None
                       else f"{s['page_cache_hits']} of the reads on demand were already in the OS page cache"),
        ("waiting / computing", f"{s['io_wait_s']:.3f} s waiting for reads, {s['compute_s']:.3f} s computing"),
    ]
    if pf["issued"]:
        rows.append(("read-ahead", f"{pf['issued']} reads started: {pf['useful_timely']} used in time, "
                                   f"{pf['useful_late']} used late, {pf['completed_unused']} read but not used, "
                                   f"{pf['partially_read']} cut short, {pf['cancelled_before_read']} cancelled"))
    one_pass, handshake = s.get("optimistic_tokens", 0), s.get("handshake_tokens", 0)
    rows.append(("decode", f"{one_pass} of {n} tokens in one pass (optimistic), "
                           + (f"{handshake} layer by layer without a sync, " if handshake else "")
                           + f"{n - one_pass - handshake} layer by layer; {s.get('recomputes', 0)} optimistic "
                           f"passes re-ran from a layer that missed"))
    rows.append(("prompt", f"{pre['lookups']} lookups: {pre['hits']} from the arena, {pre['prefetch_hits']} by the "
                           f"next layer's read-ahead, {pre['misses']} read on demand, "
                           f"{pre['bytes_read'] / 1e6:.2f} MB"))
    rows.append(("residency hash", s["residency_hash"]))
    return aligned(rows)


def ledger_table(rows, width: int = 44) -> str:
    """Ledger rows (dicts with id, claim, seed, seed_low, seed_high, ours, low, high, n, method, rule,
    verdict) as a text table with a header: the claim wrapped whole, the verdict in its own column,
    the rule and method on a line of their own under the claim (they say how the verdict was reached)."""
    import math
    import textwrap

    def num(x):
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4g}"

    head = ("id", "claim", "seed", "ours", "95% interval", "n", "verdict")
    cells = []
    for r in rows:
        seed = num(r["seed"]) if r["seed_low"] == r["seed_high"] else f"{num(r['seed_low'])}..{num(r['seed_high'])}"
        iv = "-" if num(r["low"]) == "-" else f"[{num(r['low'])}, {num(r['high'])}]"
        cells.append((r["id"], textwrap.wrap(r["claim"], width) or [""], seed, num(r["ours"]), iv,
                      "-" if iv == "-" else str(r["n"]), r["verdict"],
                      textwrap.wrap(f"rule: {r['rule']}; method: {r['method']}"
                                    + (f"; why: {r['reason']}" if r.get("reason") else "")
                                    + ("; depends on read timing" if r.get("timing") else ""), width)))
    w = [max([len(head[i])] + [len(c[i]) for c in cells]) for i in (0, 2, 3, 4, 5)]
    line = lambda a, b, c, d, e, f, g: (f"{a:<{w[0]}}  {b:<{width}}  {c:<{w[1]}}  {d:>{w[2]}}  {e:<{w[3]}}  "  # noqa: E731
                                        f"{f:>{w[4]}}  {g}").rstrip()
    out = [line(*head), line(*("-" * len(h) if i != 1 else "-" * width for i, h in enumerate(head)))]
    for ident, claim, seed, ours, iv, n, verdict, how in cells:
        out.append(line(ident, claim[0], seed, ours, iv, n, verdict))
        out += [line("", more, "", "", "", "", "") for more in claim[1:] + how]
    return "\n".join(out)
