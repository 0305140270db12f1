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


def summary_table(s: dict) -> str:
    pf = s["prefetch"]
    rows = [
        ("tokens", f"{s['tokens']} ({s['distinct_tokens']} distinct)"),
        ("tokens/s", f"{s['tokens_per_s']:.2f} (median {s['median_token_ms']:.2f} ms/token)"),
        ("arena", f"{s['arena_slots']} of {s['routed_experts']} experts ({s['expert_bytes'] / 1e6:.3f} MB each)"),
        ("hits / misses", f"{s['hits']} / {s['misses']} (hit rate {s['hit_rate']:.1%}), {s['evictions']} evictions"),
        ("page-cache hits", "n/a (reads bypass the page cache)" if s["page_cache_hits"] is None
                            else f"{s['page_cache_hits']} of the misses were already in the OS page cache"),
        ("bytes read", f"{s['bytes_read'] / 1e6:.2f} MB ({s['bytes_per_token'] / 1e6:.3f} MB/token)"),
        ("io wait / compute", f"{s['io_wait_s']:.3f} s / {s['compute_s']:.3f} s"),
        ("prefetch", ", ".join(f"{k} {v}" for k, v in pf.items())),
        ("decode", f"{s.get('optimistic_tokens', 0)} of {s['tokens']} tokens optimistic (one sync each), "
                   + (f"{s['handshake_tokens']} through the handshake (no sync per layer), "
                      if s.get("handshake_tokens") else "")
                   + f"{s.get('recomputes', 0)} recomputes over {s.get('recomputed_layers', 0)} layers"),
        ("prefill", f"hits {s['prefill']['hits']}, misses {s['prefill']['misses']}, "
                    f"{s['prefill']['bytes_read'] / 1e6:.2f} MB"),
        ("residency hash", s["residency_hash"]),
    ]
    return aligned(rows)
