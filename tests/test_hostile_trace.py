"""Damaged traces (metadata and columns) and bad flags of the trace commands: one line, exit 2."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.hostile_util import assert_clean_error, cli
from workbench.cli import main
from workbench.engine.engine import Engine
from workbench.trace.recorder import TraceRecorder
from workbench.trace.schema import META_KEY, TraceError, read_trace


@pytest.fixture(scope="module")
def recorded(tiny, tmp_path_factory):
    """A real trace of the tiny model (with a predictor column), and its store."""
    from workbench.config import AheadConfig

    _, store = tiny("qwen3_moe", 4)
    path = tmp_path_factory.mktemp("trace") / "run.parquet"
    with Engine(store, arena="0.5", ahead=AheadConfig("layer", 1), progress=False) as eng:
        eng.generate([3, 14, 15, 92, 65, 35], max_tokens=6, trace=TraceRecorder(path))
    return path, store


def _damage(src, dst, meta=None, columns=None, raw_meta=None):
    """Rewrite trace ``src`` as ``dst`` with ``meta(m)`` applied to its metadata and ``columns(t)`` to its table."""
    t = pq.read_table(src)
    m = json.loads(t.schema.metadata[META_KEY])
    if meta is not None:
        out = meta(m)
        m = m if out is None else out
    if columns is not None:
        t = columns(t)
    raw = raw_meta if raw_meta is not None else json.dumps(m).encode()
    pq.write_table(t.replace_schema_metadata({META_KEY: raw}), dst)
    return dst


def _meta(key, value):
    def fn(m):
        m[key] = value
    return fn


def _column(name, values, typ):
    def fn(t):
        i = t.column_names.index(name)
        return t.set_column(i, pa.field(name, typ), pa.array(values(t), type=typ))
    return fn


def _selected(edit):
    def values(t):
        rows = t.column("selected").to_pylist()
        edit(rows)
        return rows
    return _column("selected", values, pa.list_(pa.int16()))


def _first(value):
    def edit(rows):
        rows[2] = value
    return edit


META_CASES = [
    ("null", lambda m: "null", "a JSON null"),  # replaced below by raw bytes
    ("list", lambda m: [m], "a JSON list, not an object"),
    ("n_experts_null", _meta("n_experts", None), "n_experts is None"),
    ("n_experts_string", _meta("n_experts", "8"), "n_experts is '8'"),
    ("n_experts_10_12", _meta("n_experts", 10**12), "n_experts is 1000000000000"),
    ("top_k_0", _meta("top_k", 0), "top_k is 0"),
    ("moe_layers_null", _meta("moe_layers", None), "moe_layers must be"),
    ("moe_layers_dupes", _meta("moe_layers", [0, 0]), "moe_layers must be"),
    ("missing", lambda m: {k: v for k, v in m.items() if k != "top_k"}, "missing ['top_k']"),
    ("expert_bytes_neg", _meta("expert_bytes", -1), "expert_bytes is -1"),
    ("stats_list", _meta("stats", [1]), "stats is a list"),
    ("n_experts_too_small", _meta("n_experts", 2), "routes expert"),
]

COLUMN_CASES = [
    ("selected_null_row", _selected(_first(None)), "row 2 has no selected experts (null)"),
    ("selected_out_of_range", _selected(_first([1, 99])), "routes expert 99, outside 0..7"),
    ("selected_negative", _selected(_first([-1, 2])), "routes expert -1"),
    ("selected_null_id", _selected(_first([None, 2])), "holds a null expert id"),
    ("selected_string", _column("selected", lambda t: ["1,2"] * t.num_rows, pa.string()), "column 'selected' has type string"),
    ("layer_unknown", _column("layer", lambda t: [7] * t.num_rows, pa.int16()), "layers [7] not in its moe_layers"),
    ("phase_bogus", _column("phase", lambda t: ["warmup"] * t.num_rows, pa.string()), "holds ['warmup']"),
    ("pred_out_of_range", _column("pred_layer", lambda t: [[50]] * t.num_rows, pa.list_(pa.int16())),
     "column 'pred_layer' routes expert 50"),
    ("step_float", _column("step", lambda t: [1.5] * t.num_rows, pa.float32()), "column 'step' has type float"),
]


@pytest.mark.parametrize("name, fn, msg", META_CASES, ids=[c[0] for c in META_CASES])
def test_damaged_metadata(recorded, tmp_path, name, fn, msg):
    p = _damage(recorded[0], tmp_path / "t.parquet", meta=fn, raw_meta=b"null" if name == "null" else None)
    with pytest.raises(TraceError) as e:
        read_trace(p)
    assert msg in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)


def test_metadata_not_json(recorded, tmp_path):
    p = _damage(recorded[0], tmp_path / "t.parquet", raw_meta=b"{n_experts: 8")
    with pytest.raises(TraceError, match="metadata is not valid JSON"):
        read_trace(p)
    from workbench.sim.sweep import Grid

    with pytest.raises(TraceError, match=f"trace {p} metadata is not valid JSON"):  # a sweep reads only the footer
        Grid(traces=[p]).cells()


@pytest.mark.parametrize("name, fn, msg", COLUMN_CASES, ids=[c[0] for c in COLUMN_CASES])
def test_damaged_columns(recorded, tmp_path, name, fn, msg):
    p = _damage(recorded[0], tmp_path / "t.parquet", columns=fn)
    with pytest.raises(TraceError) as e:
        read_trace(p)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_damaged_io_table(recorded, tmp_path):
    import shutil

    p = tmp_path / "t.parquet"
    shutil.copy(recorded[0], p)
    (tmp_path / "t.io.parquet").write_bytes(b"junk")
    with pytest.raises(TraceError, match="I/O table .* is not a readable Parquet"):
        read_trace(p)


def _commands(trace, store, out):
    return {
        "replay": ["replay", trace],
        "simulate": ["simulate", trace],
        "ioreplay": ["ioreplay", trace, store, "--compute-ms", "0"],
        "analyze": ["analyze", trace, "--what", "union", "--out", out, "--no-chart"],
        "export": ["export", trace, "--format", "csv", out / "x.csv"],
    }


@pytest.mark.parametrize("damage", [dict(raw_meta=b"null"), dict(meta=_meta("n_experts", 10**12)),
                                    dict(columns=_selected(_first([1, 99]))), dict(columns=_selected(_first(None)))],
                         ids=["meta_null", "n_experts_10_12", "expert_99", "selected_null"])
@pytest.mark.parametrize("command", ["replay", "simulate", "ioreplay", "analyze", "export"])
def test_every_trace_command_refuses_a_damaged_trace(recorded, tmp_path, capsys, damage, command):
    p = _damage(recorded[0], tmp_path / "t.parquet", **damage)
    argv = [str(a) for a in _commands(p, recorded[1], tmp_path / "out")[command]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "trace" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out" / "x.csv").exists()


def test_trace_commands_in_a_subprocess(recorded, tmp_path):
    p = _damage(recorded[0], tmp_path / "t.parquet", raw_meta=b"null")
    assert_clean_error(cli("replay", p), "a JSON null")
    assert_clean_error(cli("ioreplay", p, recorded[1]), "a JSON null")


def test_recorded_trace_still_reads_and_replays(recorded, capsys):
    tr = read_trace(recorded[0])
    assert tr.n_experts == 8 and "pred_layer" in tr.routes.columns
    assert main(["replay", str(recorded[0]), "--arena", "25%", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["capacity"] == 4


# ---- flags ----------------------------------------------------------------------------------

FLAG_CASES = [
    ("simulate", ["--compute-ms", "-5"], "--compute-ms -5.0 is out of range"),
    ("simulate", ["--compute-ms", "nan"], "--compute-ms must be a finite number"),
    ("simulate", ["--moce-bonus", "nan"], "--moce-bonus must be a finite number"),
    ("simulate", ["--io-workers", "100000"], "--io-workers 100000 is out of range"),
    ("simulate", ["--bandwidth-gbs", "0"], "--bandwidth-gbs 0.0 is out of range"),
    ("simulate", ["--policy", "static"], "--policy static pins the experts of a hotlist"),
    ("ioreplay", ["--compute-ms", "-5"], "--compute-ms -5.0 is out of range"),
    ("ioreplay", ["--io-workers", "100000"], "--io-workers 100000 is out of range"),
    ("ioreplay", ["--policy", "static"], "give --hotlist FILE"),
    ("ioreplay", ["--lookahead", "0"], "--lookahead 0 is out of range"),
    ("replay", ["--policy", "lru,static"], "give -o hotlist=FILE"),
    ("replay", ["--arena", "2G"], "cannot read arena size '2G'"),
    ("export", ["--size", "0"], "--size 0 is out of range"),
    ("run", ["--io-workers", "100000"], "--io-workers 100000 is out of range: give a value in [1, 256]"),
    ("run", ["--io-reserved", "9"], "--io-reserved 9 is out of range"),
    ("run", ["--ahead-width", "0"], "--ahead-width 0 is out of range"),
    ("run", ["--moce-bonus", "nan"], "--moce-bonus must be a finite number"),
    ("run", ["--moce-bonus", "inf"], "--moce-bonus must be a finite number"),
    ("run", ["--policy", "static"], "give --hotlist FILE"),
    ("run", ["--max-tokens", "0"], "--max-tokens 0 is out of range"),
]


@pytest.mark.parametrize("command, flags, msg", FLAG_CASES, ids=[f"{c[0]}{''.join(c[1])}" for c in FLAG_CASES])
def test_bad_flags_are_refused_up_front(recorded, tmp_path, capsys, monkeypatch, command, flags, msg):
    import workbench.store.manifest as manifest

    trace, store = recorded
    base = {"run": ["run", str(store), "--prompt-ids", "1,2"], "simulate": ["simulate", str(trace)],
            "ioreplay": ["ioreplay", str(trace), str(store)], "replay": ["replay", str(trace)],
            "export": ["export", str(trace), "--format", "csv", str(tmp_path / "x.csv")]}[command]
    opened = []
    real = manifest.Manifest.load
    monkeypatch.setattr(manifest.Manifest, "load", classmethod(lambda cls, *a, **k: opened.append(1) or real(*a, **k)))
    assert main(base + flags) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1, err
    assert not opened  # refused before a store was opened


def test_subprocess_io_workers(recorded):
    assert_clean_error(cli("run", recorded[1], "--prompt-ids", "1", "--io-workers", "100000"), "--io-workers 100000")


def test_replay_moce_bonus_and_sizes_share_one_parser(recorded, capsys):
    from workbench.sizes import arena_slots, parse_bytes

    assert parse_bytes("2GB") == 2 * 10**9 and parse_bytes("2GiB") == 2 * 2**30 and parse_bytes("2 gib") == 2**31
    assert parse_bytes("512") == 512 and parse_bytes("1.5KB") == 1500
    with pytest.raises(ValueError, match="KiB, MiB, GiB"):
        parse_bytes("2G")
    assert arena_slots("25%", 64) == 16 and arena_slots("0.25", 64) == 16 and arena_slots(0.25, 64) == 16
    assert arena_slots("16", 64) == 16 and arena_slots("16KB", 64, expert_bytes=1000) == 16
    assert arena_slots("16KiB", 64, expert_bytes=1024) == 16 and arena_slots("1GB", 64, expert_bytes=1) == 64
    for bad, msg in (("0%", "percentage"), ("150%", "percentage"), ("1.5", "fraction"), ("-3", "cannot read"),
                     ("abc", "cannot read"), ("nan", "cannot read"), ("16KB", "expert size is unknown"), (True, "cannot read")):
        with pytest.raises(ValueError, match=msg):
            arena_slots(bad, 64)
    with pytest.raises(ValueError, match="cannot hold one layer's 8"):
        arena_slots("4", 64, top_k=8)
    assert not math.isnan(arena_slots("100%", 64))
    # the analysis --budget and the engine agree: 2GB is 2e9 bytes everywhere
    from workbench.cli_analysis import _parse_size

    assert _parse_size("9GB") == 9 * 10**9 and _parse_size("9GiB") == 9 * 2**30


def test_empty_or_garbage_hotlist_is_refused(recorded, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    junk = tmp_path / "junk.txt"
    junk.write_bytes(b"\x00\xff garbage\n")
    big = tmp_path / "big.txt"
    big.write_text("99999999999999999999\n")
    for path, msg in ((empty, "holds no keys"), (junk, "is not text"), (big, "outside the model")):
        assert main(["run", str(recorded[1]), "--prompt-ids", "1", "--policy", "static", "--hotlist", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and len(err.splitlines()) == 1, err


def test_python_api_refuses_static_without_a_hotlist(recorded):
    from workbench.sim.replay import replay
    from workbench.config import ArenaConfig
    from workbench.sim.vtime import simulate

    with pytest.raises(ValueError, match="pins the experts of a hotlist"):
        replay(recorded[0], "static", "0.5")
    with pytest.raises(ValueError, match="pins the experts of a hotlist"):
        simulate(recorded[0], ArenaConfig("0.5", "static"))
    assert replay(recorded[0], "static", "0.5", keys=[0, 1]).capacity == 8
