"""`workbench analyze` / `workbench bound` through cli_analysis.register."""

import argparse
import dataclasses
import json

import numpy as np

from workbench import cli_analysis
from workbench.trace.synthetic import periodic_routes, routes_trace


def run(argv):
    p = argparse.ArgumentParser(prog="workbench")
    cli_analysis.register(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(argv)
    return args.func(args)


def test_bound_text_and_json(capsys):
    assert run(["bound", "--union", "1:8,2:13.42,3:17.99,8:35.01", "--k", "8"]) == 0
    out = capsys.readouterr().out
    assert "ceiling (a -> 1): 1.828x at g=8" in out and "break-even acceptance: 0.6775 (g=2)" in out
    assert run(["bound", "--union", "1:8,2:13.42,3:17.99,8:35.01", "--k", "8", "--json", "--acceptance", "0.8,0.9"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["ceiling_g"] == 8 and abs(d["ceiling"] - 1.828) < 1e-3
    assert [s["best_g"] for s in d["speedups"]] == [3, 8]
    assert abs(d["break_even"] - 0.6775) < 1e-6 and abs(d["break_even_by_g"]["3"] - 0.7242) < 1e-4
    # a fixed window can be a net loss
    assert run(["bound", "--union", "1:8,2:13.42,3:17.99,8:35.01", "--k", "8", "--g", "3", "--json",
                "--acceptance", "0.7"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["speedups"][0]["speedup"] < 1 and abs(d["break_even"] - 0.7242) < 1e-4


def test_bound_bad_input(capsys):
    assert run(["bound", "--union", "1-8", "--k", "8"]) == 2
    assert "G:UNION" in capsys.readouterr().err


def test_analyze_union_and_gates_write_tables_and_charts(tmp_path, capsys):
    tr = tmp_path / "run.parquet"
    routes_trace(tr, periodic_routes(20, 2, 4, 3), 12)
    assert run(["analyze", str(tr), "--what", "union", "--g-max", "5", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "speedup bound" in out
    for f in ("union.csv", "union.png", "union.svg", "speedup.png"):
        assert (tmp_path / "o" / f).exists(), f
    assert run(["analyze", str(tr), "--what", "gates", "--no-chart"]) == 0
    assert (tmp_path / "run.analysis" / "gates.csv").exists()
    assert "drop-weakest error skipped" in capsys.readouterr().out


def test_analyze_errors(tmp_path, capsys):
    assert run(["analyze", str(tmp_path / "missing.parquet"), "--what", "union"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert run(["analyze", "--what", "cosine"]) == 2
    assert "--model" in capsys.readouterr().err


def _save_tiny_model(path):
    import mlx.core as mx
    from mlx_lm.models import qwen3_moe
    from mlx_lm.utils import save_config, save_model

    args = qwen3_moe.ModelArgs(model_type="qwen3_moe", hidden_size=32, num_hidden_layers=3, intermediate_size=64,
                               num_attention_heads=2, num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1,
                               mlp_only_layers=[], moe_intermediate_size=16, rms_norm_eps=1e-6, vocab_size=32,
                               num_key_value_heads=1, head_dim=16, rope_theta=1e4, tie_word_embeddings=False,
                               max_position_embeddings=64, norm_topk_prob=True)
    mx.random.seed(0)
    model = qwen3_moe.Model(args)
    path.mkdir()
    save_model(path, model)
    save_config(dataclasses.asdict(args), path / "config.json")
    return model


def test_analyze_with_model_dir(tmp_path, capsys):
    import mlx.core as mx

    model = _save_tiny_model(tmp_path / "m")
    rng = np.random.default_rng(0)
    xs = [[rng.normal(size=32).astype(np.float16) for _ in range(3)] for _ in range(6)]
    sel, w = [], []
    for t in range(6):
        rs, rw = [], []
        for j in range(3):
            p = np.array(mx.softmax(model.model.layers[j].mlp.gate(mx.array(np.float32(xs[t][j]))), axis=-1))
            ids = np.argsort(-p)[:2]
            rs.append(ids.tolist()), rw.append((p[ids] / p[ids].sum()).tolist())
        sel.append(rs), w.append(rw)
    tr = tmp_path / "run.parquet"
    routes_trace(tr, sel, 8, weights=w, moe_input=xs)
    assert run(["analyze", str(tr), "--what", "lookahead", "--model", str(tmp_path / "m"), "--no-chart"]) == 0
    out = capsys.readouterr().out
    d0 = [l for l in out.splitlines() if l.strip().startswith("d=0")]
    assert d0 and "1.0000" in d0[0]  # the router on its own input reproduces the trace
    assert run(["analyze", "--what", "cosine", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "c"),
                "--no-chart"]) == 0
    assert (tmp_path / "c" / "cosine.csv").exists()
    assert run(["analyze", str(tr), "--what", "gates", "--model", str(tmp_path / "m"), "--no-chart"]) == 0
    assert "drop-weakest relative L2 error" in capsys.readouterr().out


def test_analyze_bounds(tmp_path, capsys):
    tr = tmp_path / "run.parquet"
    routes_trace(tr, periodic_routes(30, 2, 2, 3), 6)
    assert run(["analyze", str(tr), "--what", "bounds", "--max-slots", "6", "--budget", "4MB", "--no-chart"]) == 0
    out = capsys.readouterr().out
    assert "hit rate vs slots per layer" in out and "static pinning upper bound" in out
    import pandas as pd

    hc = pd.read_csv(tmp_path / "run.analysis" / "hit_curves.csv")
    # period 3 over 2-expert blocks = 6 distinct experts per layer: LRU and Belady hit everything but
    # the 6 cold misses at 6 slots
    at6 = hc[hc.slots == 6].groupby("policy")["hits"].sum()
    assert (at6 == 2 * (30 * 2 - 6)).all()


def test_fit_my_machine_table_and_chart(tiny):
    """One run per arena size: GB, speed, hit rate and peak memory; a bigger arena hits more."""
    from workbench.analysis.fit import fit_table
    from workbench.viz.charts import fit_chart

    _, store = tiny("qwen3_moe", 4)
    t = fit_table(store, [5, 17, 3, 99, 42], arenas=("0.25", "1.0"), max_tokens=6)
    assert list(t.arena) == ["0.25", "1.0"] and (t.arena_gb.diff().dropna() > 0).all()
    assert t.hit_rate.iloc[1] == 1.0 > t.hit_rate.iloc[0]
    assert (t.peak_memory_gb > t.arena_gb).all() and (t.tokens_per_s > 0).all()
    assert "arena (GB)" in str(fit_chart(t).to_dict())


def test_read_path_table_reports_the_spread_of_repeats(tiny):
    from workbench.io.readpath import read_path_table

    _, store = tiny("qwen3_moe", 4)
    t = read_path_table(store, threads=(1,), modes=("buffered",), reps=2, progress=False)
    assert ((t.gbps_min <= t.gbps) & (t.gbps <= t.gbps_max)).all() and (t.gbps_min > 0).all()


def test_demand_read_latency_is_timed_split_and_whole_cold_and_warm(tiny):
    from workbench.io.readpath import demand_read_us

    _, store = tiny("qwen3_moe")
    times = [demand_read_us(store, split=split, cold=cold, workers=2, n=4) for split in (True, False)
             for cold in (False, True)]
    assert all(0 < t < 1e6 for t in times), times


def test_missing_trace_columns_name_the_flag_that_records_them():
    import pandas as pd
    import pytest

    from workbench.analysis._common import require_columns

    with pytest.raises(ValueError, match=r"lacks; record it again: workbench run \.\.\. --trace FILE --trace-moe-input"):
        require_columns(pd.DataFrame({"selected": [1]}), ["selected", "moe_input"], "lookahead recovery")
    with pytest.raises(ValueError, match="--trace-moe-input"):
        require_columns(pd.DataFrame({"moe_input": [None]}), ["moe_input"], "lookahead recovery")


def test_compare_table_names_its_units():
    from workbench.cli_policy import ROWS, table

    stats = {k: 0 for k in ROWS if "." not in k}
    stats.update(bytes_per_token=2.23e6, hit_rate=0.5, prefetch={k.split(".")[1]: 0 for k in ROWS if "." in k})
    text = table([{"name": "a", **stats}])
    assert "MB read per token" in text and "2.230" in text and "e+06" not in text and "hit rate (%)" in text
