"""Trace export (oracleGeneral, CSV), interoperability (pandas, polars, DuckDB) and the
libCacheSim crosscheck.

libCacheSim mapping used by the crosscheck: every request has the same ``obj_size`` S (the
expert blob size), so a libCacheSim cache of ``N * S`` bytes holds exactly N experts
(object metadata is not counted by default), i.e. our N slots. Its LRU, FIFO and LFU (in-
cache frequency starting at 1, ties evict the least recently used) and Belady (every miss
admitted, evict the furthest next access; reads our -1 as never) are the same algorithms as
our ``lru``, ``fifo``, ``lfu`` and ``bounds.belady``; miss counts must agree exactly.
"""

import json

import numpy as np
import pandas as pd
import pytest

from workbench.analysis.bounds import belady_misses
from workbench.cli import main as cli
from workbench.sim.export import export, export_csv, export_oraclegeneral, read_oraclegeneral, request_frame
from workbench.sim.replay import replay
from workbench.sim.requests import requests_from_trace
from workbench.trace.synthetic import synthetic_trace

EB = 1_179_648  # a MiniMax-like 1.18 MB expert blob


@pytest.fixture
def trace(tmp_path):
    p = tmp_path / "t.parquet"
    synthetic_trace(p, n_tokens=20, n_layers=3, n_experts=16, top_k=4, kind="zipf", prefill_tokens=2, expert_bytes=EB)
    return p


def test_oraclegeneral_roundtrip(trace, tmp_path):
    out = tmp_path / "t.oracleGeneral.bin"
    n = export_oraclegeneral(trace, out)
    assert out.stat().st_size == 24 * n
    back = read_oraclegeneral(out)
    req = requests_from_trace(trace)
    assert back["obj_id"].tolist() == req.keys.tolist()
    assert back["time"].tolist() == req.step.tolist()
    assert (back["obj_size"] == EB).all()
    # next access: index of the next request for the same object, -1 for never
    ids = back["obj_id"].to_numpy()
    nxt = back["next_access_vtime"].to_numpy()
    for i in range(len(ids)):
        later = np.flatnonzero(ids[i + 1:] == ids[i])
        assert nxt[i] == (i + 1 + later[0] if len(later) else -1)
    # the raw bytes: little endian u32 time, u64 id, u32 size, i64 next
    raw = out.read_bytes()[:24]
    assert int.from_bytes(raw[4:12], "little") == req.keys[0]
    assert int.from_bytes(raw[12:16], "little") == EB


def test_csv_roundtrip(trace, tmp_path):
    out = tmp_path / "t.csv"
    n = export_csv(trace, out, phase="decode")
    df = pd.read_csv(out)
    assert list(df.columns) == ["time", "obj_id", "obj_size", "next_access_vtime", "layer", "expert", "phase"]
    assert len(df) == n == 20 * 3 * 4
    assert (df["obj_id"] == df["layer"] * 16 + df["expert"]).all()
    assert set(df["phase"]) == {"decode"}
    assert df["time"].min() == 1


def test_export_errors(trace, tmp_path):
    with pytest.raises(ValueError, match="valid formats: oraclegeneral, csv"):
        export(trace, "parquet", tmp_path / "x")
    with pytest.raises(ValueError, match="object size"):
        export(trace, "oraclegeneral", tmp_path / "x", size=0)


def test_cli_export(trace, tmp_path, capsys):
    out = tmp_path / "o.bin"
    assert cli(["export", str(trace), "--format", "oraclegeneral", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert len(read_oraclegeneral(out)) == len(request_frame(trace))


def test_trace_reads_as_pandas_polars_and_duckdb(trace):
    pdf = pd.read_parquet(trace)
    assert {"step", "layer", "selected"} <= set(pdf.columns)
    pl = pytest.importorskip("polars")
    plf = pl.read_parquet(trace)
    assert plf.height == len(pdf)
    assert plf.explode("selected").height == 22 * 3 * 4
    duckdb = pytest.importorskip("duckdb")
    (n,), = duckdb.sql(f"SELECT count(*) FROM (SELECT unnest(selected) AS e FROM '{trace}')").fetchall()
    assert n == 22 * 3 * 4
    top = duckdb.sql(f"SELECT layer, count(*) AS c FROM '{trace}' WHERE phase = 'decode' GROUP BY layer ORDER BY layer").df()
    assert top["c"].tolist() == [20, 20, 20]
    meta = json.loads(duckdb.sql(f"SELECT value FROM parquet_kv_metadata('{trace}') WHERE key = 'workbench'").fetchall()[0][0])
    assert meta["n_experts"] == 16


# --- libCacheSim crosscheck (optional extra: pip install libcachesim; GPL, never required) ---

def _libcachesim():
    try:
        import libcachesim
    except ImportError:
        pytest.skip("libcachesim is not importable here (optional [crosscheck] extra; .ci/run installs it where a wheel exists)")
    return libcachesim


@pytest.mark.parametrize("kind,seed", [("zipf", 0), ("sticky", 1), ("random", 2)])
def test_crosscheck_with_libcachesim(tmp_path, kind, seed):
    lcs = _libcachesim()
    p = tmp_path / "c.parquet"
    synthetic_trace(p, n_tokens=120, n_layers=4, n_experts=32, top_k=4, kind=kind, seed=seed, expert_bytes=EB)
    out = tmp_path / "c.bin"
    n = export_oraclegeneral(p, out)
    keys = requests_from_trace(p).keys
    for slots in (4, 17, 40, 100):
        reader = lcs.TraceReader(str(out), lcs.TraceType.ORACLE_GENERAL_TRACE)
        for ours, theirs in (("lru", lcs.LRU), ("fifo", lcs.FIFO), ("lfu", lcs.LFU), ("belady", lcs.Belady)):
            miss_ratio, _ = theirs(slots * EB, hashpower=12).process_trace(reader)
            lcs_misses = int(round(miss_ratio * n))
            our_misses = belady_misses(keys, slots) if ours == "belady" else replay(p, ours, slots, preload=False).misses
            assert our_misses == lcs_misses, (ours, slots)
