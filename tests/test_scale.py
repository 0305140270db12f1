"""synth-store (real shapes, random contents), ioreplay's explicit layer/expert maps, and
policy sweeps on a two-worker Dask LocalCluster on 127.0.0.1."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

from workbench.cli import main
from workbench.sim.ioreplay import layer_plan
from workbench.trace.synthetic import synthetic_trace
from workbench.store.manifest import ALIGN, EXPERTS, MANIFEST, Manifest
from workbench.store.synth import resolve_shape, store_bytes


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "store"
    assert main(["synth-store", "--like", "tiny", "--bits", "4", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("traces")
    synthetic_trace(d / "zipf.parquet", n_tokens=20, n_layers=3, n_experts=16, top_k=2, kind="zipf", predictors=(1, 2),
                    expert_bytes=1 << 16)
    synthetic_trace(d / "sticky.parquet", n_tokens=20, n_layers=3, n_experts=16, top_k=2, kind="sticky", predictors=(1,),
                    expert_bytes=1 << 16)
    return d / "zipf.parquet", d / "sticky.parquet"


@pytest.fixture(scope="module")
def cluster():
    from dask.distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as c:
        yield c


# --- synth-store -----------------------------------------------------------------------

def test_synth_store_manifest_is_fully_consistent(tiny_store):
    m = Manifest.load(tiny_store)
    data = json.loads((tiny_store / MANIFEST).read_text())
    raw = (tiny_store / EXPERTS).read_bytes()
    assert len(raw) == data["experts_file_size"] == data["blob_stride"] * m.n_routed
    assert len(m.blobs) == m.n_routed == 2 * 8 and m.top_k == 2
    crcs = set()
    for b in m.blobs.values():
        assert b.offset % ALIGN == 0 and b.size == m.expert_bytes
        assert zlib.crc32(raw[b.offset:b.offset + b.size]) == b.crc32
        crcs.add(b.crc32)
    assert len(crcs) == m.n_routed  # random contents, every expert different


def test_synth_store_shapes_are_mlx_quantized_shapes(tiny_store):
    import mlx.core as mx

    m = Manifest.load(tiny_store)
    specs = {t.name: t for t in m.tensors}
    shape = resolve_shape("tiny")
    for name, (out_dim, in_dim) in {"gate_proj": (shape.width, shape.hidden), "up_proj": (shape.width, shape.hidden),
                                    "down_proj": (shape.hidden, shape.width)}.items():
        w, scales, biases = mx.quantize(mx.zeros((out_dim, in_dim), dtype=mx.bfloat16), group_size=64, bits=4)
        for part, a in (("weight", w), ("scales", scales), ("biases", biases)):
            t = specs[f"{name}.{part}"]
            assert t.shape == tuple(a.shape) and t.dtype == str(a.dtype).split(".")[-1] and t.nbytes == a.nbytes


def test_synth_store_reads_back_through_the_engine_reader(tiny_store):
    from workbench.store.reader import BlobReader

    m = Manifest.load(tiny_store)
    reader = BlobReader(tiny_store, m, mode="buffered", verify="always")
    try:
        bufs = [bytearray(t.nbytes) for t in m.tensors]
        for b in m.blobs.values():
            assert reader.read(b, [memoryview(x) for x in bufs]) == m.expert_bytes
    finally:
        reader.close()


def test_preset_sizes_follow_the_published_configs():
    # Qwen3-30B-A3B, 4-bit: 3 x (768 x 2048 / 2 weight bytes + 2 x 768 x 2048 / 64 x 2 scale/bias bytes)
    assert store_bytes(resolve_shape("qwen3-30b-a3b"), 4) == (2654208, 2654208 * 48 * 128)
    # Mixtral-8x7B, 4-bit: 3 x (14336 x 4096 / 2 + 2 x 14336 x 4096 / 64 x 2); stride rounds to 16 KiB
    assert store_bytes(resolve_shape("mixtral-8x7b"), 4)[0] == 3 * (14336 * 4096 // 2 + 2 * 14336 * 4096 // 64 * 2)
    assert resolve_shape("glm-4.5-air", layers=3).layers == 3 and resolve_shape("glm-4.5-air").first_moe_layer == 1


def test_synth_store_explicit_shape_and_refusals(tmp_path, capsys):
    out = tmp_path / "explicit"
    assert main(["synth-store", "--layers", "3", "--experts", "4", "--hidden", "64", "--expert-width", "128",
                 "--top-k", "2", "--bits", "8", str(out)]) == 0
    m = Manifest.load(out)
    assert m.moe_layers == [0, 1, 2] and m.n_experts == 4 and m.data["synthetic"]["bits"] == 8
    capsys.readouterr()
    assert main(["synth-store", "--like", "tiny", str(out)]) == 2  # never overwrites a store
    assert "already holds a store" in capsys.readouterr().err
    assert main(["synth-store", "--layers", "3", str(tmp_path / "x")]) == 2
    assert "--expert-width" in capsys.readouterr().err


def test_synth_store_refuses_when_the_disk_lacks_room(tmp_path, capsys):
    out = tmp_path / "huge"
    assert main(["synth-store", "--like", "glm-4.5-air", "--layers", "100000", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "not enough disk" in err[-1] and "GB free" in err[-1]  # the size line, then the refusal
    assert not out.exists() and list(tmp_path.iterdir()) == []


# --- ioreplay maps -----------------------------------------------------------------------

def test_layer_plan_modulo_and_spread():
    assert layer_plan(range(12), [1, 2, 3, 4, 5], "modulo") == [(1, 0), (2, 1), (3, 2), (4, 3), (5, 4)]
    assert layer_plan(range(3), range(7), "modulo") == [(0, 0), (1, 1), (2, 2), (3, 0), (4, 1), (5, 2), (6, 0)]
    assert layer_plan(range(3), range(6), "spread") == [(0, 0), (1, 0), (2, 1), (3, 1), (4, 2), (5, 2)]
    with pytest.raises(ValueError, match="--map-layers"):
        layer_plan(range(3), range(6))


def test_ioreplay_maps_only_when_asked(tiny_store, traces, capsys):
    from workbench.trace.schema import read_trace

    trace = traces[0]
    capsys.readouterr()
    assert main(["ioreplay", str(trace), str(tiny_store), "--arena", "0.5", "--json"]) == 2
    assert "--map-layers" in capsys.readouterr().err
    assert main(["ioreplay", str(trace), str(tiny_store), "--arena", "0.5", "--map-layers", "spread", "--json"]) == 2
    assert "--map-experts modulo" in capsys.readouterr().err
    assert main(["ioreplay", str(trace), str(tiny_store), "--arena", "0.5", "--map-layers", "modulo",
                 "--map-experts", "modulo", "--compute-ms", "0", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    dec = read_trace(trace).decode()
    sel = {(int(s), int(layer)): np.asarray(v) for s, layer, v in zip(dec.step, dec.layer, dec.selected)}
    plan = layer_plan([0, 1, 2], [0, 1], "modulo")
    want = sum(len(np.unique(sel[(s, tl)] % 8)) for s in sorted(dec.step.unique()) for _, tl in plan)
    assert st["tokens"] == 20 and st["layers_per_token"] == 2 and st["map_layers"] == "modulo"
    assert st["hits"] + st["misses"] + st["prefetch"]["useful_late"] + st["prefetch"]["useful_timely"] == want
    assert st["bytes_read"] == st["misses"] * st["expert_bytes"]


# --- sweeps -----------------------------------------------------------------------------

def test_sweep_rows_are_the_library_results(cluster, traces, tmp_path):
    from workbench.config import AheadConfig, ArenaConfig
    from workbench.sim.replay import replay
    from workbench.sim.sweep import Grid, load_sweep, sweep
    from workbench.sim.vtime import Timing, simulate

    grid = Grid(traces=list(traces), policies=["lru", "fifo"], arenas=["0.25", "0.5"], predictors=["none", "d1"],
                gates=["none", "confidence"], timing={"bandwidth": 1e9})
    res = sweep(grid, tmp_path / "out", scheduler=cluster.scheduler_address, progress=False)
    assert (res.total, res.ran, res.skipped) == (2 * 2 * 2 * 3, 24, 0)  # predictor none collapses the gates
    df = load_sweep(tmp_path / "out")
    assert len(df) == 24 and df.cell_id.is_unique and (df.cell_s > 0).all()
    assert {w for w in df.worker} <= set(cluster.scheduler_info["workers"])
    row = df[(df.workload == "sticky") & (df.policy == "fifo") & (df.arena == "0.25") & (df.predictor == "d1")
             & (df.gate == "confidence")].iloc[0]
    s = simulate(traces[1], ArenaConfig(12, "fifo"), AheadConfig("d1", gate="confidence"), timing=Timing(bandwidth=1e9)).summary
    assert (row.slots, row.sync_misses, row.bytes_read, row.prefetch_issued) == (12, s["sync_misses"], s["bytes_read"],
                                                                                s["prefetch"]["issued"])
    assert row.bytes_per_token == s["bytes_read"] / s["tokens"] and row.timing_bandwidth == 1e9
    rp = sweep(Grid(traces=[traces[0]], kind="replay", arenas=["5"]), tmp_path / "rp", scheduler=cluster.scheduler_address,
               progress=False)
    assert rp.ran == 1
    assert load_sweep(tmp_path / "rp").hits.iloc[0] == replay(traces[0], "lru", 5).hits  # replay's default: --phase all
    dec = sweep(Grid(traces=[traces[0]], kind="replay", arenas=["5"], phase="decode"), tmp_path / "rp", progress=False,
                scheduler=cluster.scheduler_address)
    assert (dec.ran, dec.skipped) == (1, 0)
    assert load_sweep(tmp_path / "rp").set_index("phase").hits["decode"] == replay(traces[0], "lru", 5, phase="decode").hits


def test_sweep_resumes_and_says_how_many_it_skipped(cluster, traces, tmp_path, capsys):
    base = ["sweep", str(traces[0]), "--policy", "lru,fifo", "--predictor", "none,oracle", "--out", str(tmp_path / "o"),
            "--scheduler", cluster.scheduler_address]
    assert main(base + ["--arena", "0.25"]) == 0
    assert "4 cells run, 0 already done" in capsys.readouterr().out
    files = sorted((tmp_path / "o").glob("part-*.parquet"))
    stamps = [f.stat().st_mtime_ns for f in files]
    assert main(base + ["--arena", "0.25,10"]) == 0
    assert "4 cells run, 4 already done and skipped, 8 in the grid" in capsys.readouterr().out
    assert [f.stat().st_mtime_ns for f in files] == stamps  # done cells are not rewritten


def test_a_stopped_sweep_keeps_what_finished(cluster, traces, tmp_path, monkeypatch):
    """Rows are appended at most every ``APPEND_S`` seconds; a sweep stopped in between (Ctrl-C) still
    writes the cells that finished, and the rerun runs only the others."""
    import tqdm.auto

    import workbench.sim.sweep as sweep_module
    from workbench.sim.sweep import Grid, load_sweep, sweep

    class Stops(tqdm.auto.tqdm):  # Ctrl-C once some cells have finished, none of them appended yet
        def refresh(self, *a, **k):
            if 0 < self.n < self.total:
                raise KeyboardInterrupt
            return super().refresh(*a, **k)

    monkeypatch.setattr(sweep_module, "APPEND_S", 1e9)
    monkeypatch.setattr(tqdm.auto, "tqdm", Stops)
    grid = Grid(traces=list(traces), kind="replay", policies=["lru", "fifo"], arenas=["6", "12"])
    out = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        sweep(grid, out, scheduler=cluster.scheduler_address, progress=False)
    kept = len(load_sweep(out))
    assert 0 < kept < len(grid.cells())
    monkeypatch.undo()
    res = sweep(grid, out, scheduler=cluster.scheduler_address, progress=False)
    assert (res.ran, res.skipped) == (len(grid.cells()) - kept, kept) and len(load_sweep(out)) == len(grid.cells())


def test_rows_that_do_not_encode_together_are_appended_apart(traces, tmp_path):
    """The rows of ended batches go in one part; where a column's type differs between batches, a part a
    batch; a batch whose own rows do not encode is kept as failed rows naming the error (it reruns)."""
    from workbench.sim.sweep import Grid, _append, _config_row, load_sweep

    cells = Grid(traces=[traces[0]], kind="replay", policies=["lru", "fifo", "lfu"], arenas=["6"]).cells()
    row = lambda c, x: {**_config_row(c), "status": "ok", "error": None, "x": x}  # noqa: E731
    assert _append(tmp_path / "one", [([c], [row(c, 1.5)]) for c in cells]) == []
    assert len(list((tmp_path / "one").glob("part-*.parquet"))) == 1
    done = [([cells[0]], [row(cells[0], True)]), ([cells[1]], [row(cells[1], "text")])]
    both = [cells[2]], [row(cells[2], True), {**row(cells[2], "text"), "cell_id": cells[2]["cell_id"]}]
    failed = _append(tmp_path / "apart", done + [both])
    assert len(list((tmp_path / "apart").glob("part-*.parquet"))) == 3 and len(failed) == 1
    df = load_sweep(tmp_path / "apart", failed=True).set_index("policy")
    assert df.status.to_dict() == {"lru": "ok", "fifo": "ok", "lfu": "failed"} and "Arrow" in df.error["lfu"]


def test_sweep_failing_cell_is_recorded_and_the_sweep_goes_on(cluster, traces, tmp_path, capsys):
    """A cell that fails on its worker (a static hotlist too large for the arena of one trace only fails there)
    is a row with its error; the other cells finish; the rerun runs the failed cells only."""
    from workbench.sim.sweep import load_sweep

    out = tmp_path / "err"
    hot = tmp_path / "hot.txt"
    hot.write_text("\n".join(str(k) for k in range(5)) + "\n")
    args = ["sweep", str(traces[0]), "--kind", "replay", "--policy", "lru,static", "--hotlist", str(hot),
            "--arena", "6,12", "--out", str(out), "--scheduler", cluster.scheduler_address]
    capsys.readouterr()
    assert main(args) == 0
    df = load_sweep(out)
    assert len(df) == 4 and set(df.status) == {"ok"}
    static = df[df.policy == "static"]
    assert (static.preloaded == 5).all()  # the hotlist is the warm set
    # a worker that fails: the trace at the same path replaced by a corrupt copy after the client hashed it
    from workbench.sim import sweep as sw

    cells = sw.Grid(traces=[traces[1]], kind="replay", arenas=["6"]).cells()
    bad = dict(cells[0], trace_sha256="0" * 64)  # a hash no file has: the worker refuses, the batch goes on
    rows = cluster_run(cluster, [bad, cells[0]])
    assert [r["status"] for r in rows] == ["failed", "ok"] and "not the trace the client hashed" in rows[0]["error"]


def cluster_run(cluster, cells):
    from dask.distributed import Client

    from workbench.sim.sweep import run_batch

    with Client(cluster.scheduler_address) as c:
        return c.submit(run_batch, cells, pure=False).result()


def test_sweep_keys_cells_by_content_and_verifies_parts(cluster, traces, tmp_path, capsys, monkeypatch):
    """issue 32 item 5: a trace re-recorded at the same path reruns; a damaged or edited part is set aside."""
    import shutil

    import workbench.sim.sweep as sweep_module
    from workbench.sim.sweep import Grid, load_sweep, sweep
    from workbench.sim.sweep_data import read_parts

    monkeypatch.setattr(sweep_module, "APPEND_S", 1e9)  # a part a sweep, however slow its batches

    t = tmp_path / "t.parquet"
    shutil.copy(traces[0], t)
    out = tmp_path / "keyed"
    run = lambda: sweep(Grid(traces=[t], kind="replay", arenas=["6", "12"]), out, scheduler=cluster.scheduler_address,  # noqa: E731
                        progress=False)
    assert run().ran == 2 and run().ran == 0
    first = load_sweep(out).sort_values("arena").hits.tolist()
    shutil.copy(traces[1], t)  # re-recorded at the same path
    assert run().ran == 2
    assert load_sweep(out).shape[0] == 4 and load_sweep(out).trace_sha256.nunique() == 2
    moved = tmp_path / "moved.parquet"
    shutil.move(t, moved)
    shutil.copy(moved, t)  # the same content again: nothing reruns
    assert run().ran == 0
    assert len(list(out.glob("part-*.parquet"))) == 2  # a sweep's rows in one part: two sweeps ran cells
    out2 = tmp_path / "damaged"
    grid = Grid(traces=[t], kind="replay", arenas=["6", "12"])
    for arena in grid.arenas:  # a part each
        assert sweep(Grid(traces=[t], kind="replay", arenas=[arena]), out2, scheduler=cluster.scheduler_address,
                     progress=False).ran == 1
    parts = sorted(out2.glob("part-*.parquet"))
    assert len(parts) == 2
    parts[0].write_bytes(parts[0].read_bytes()[:100])  # truncated
    import pyarrow.parquet as pq

    table = pq.read_table(parts[1])
    df = table.to_pandas()
    df["config_json"] = df.config_json.str.replace('"arena": "', '"arena": "1')  # a row edited to claim another cell
    pq.write_table(table.from_pandas(df, preserve_index=False), parts[1])
    with pytest.raises(ValueError, match="not readable Parquet|do not match their cell id"):
        load_sweep(out2)
    notes = []
    res = sweep(grid, out2, scheduler=cluster.scheduler_address, progress=False, log=notes.append)
    assert res.ran == 2 and sum("set aside" in n for n in notes) == 2
    assert sorted(p.name for p in out2.glob("*.bad")) == sorted(p.name + ".bad" for p in parts)
    assert sorted(load_sweep(out2).arena) == ["12", "6"] and first


def test_sweep_unreachable_scheduler_is_one_line(traces, tmp_path, capsys):
    assert main(["sweep", str(traces[0]), "--out", str(tmp_path / "u"), "--scheduler", "tcp://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in err[0]


@pytest.mark.parametrize("answer, words", [(None, "sent nothing in 1 s"), (b"HTTP/1.1 200 OK\r\n\r\nhello", "not as a Dask")])
def test_sweep_scheduler_that_does_not_answer_as_dask_is_one_line_in_time(traces, tmp_path, capsys, answer, words):
    """issue 32 item 1: a socket that accepts and sleeps, or a service that answers something else."""
    import socket
    import threading
    import time

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    conns = []

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            conns.append(c)
            if answer:
                c.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    addr = f"tcp://127.0.0.1:{srv.getsockname()[1]}"
    t0 = time.monotonic()
    try:
        assert main(["sweep", str(traces[0]), "--out", str(tmp_path / "u"), "--scheduler", addr, "--connect-timeout", "1"]) == 2
    finally:
        srv.close()
    assert time.monotonic() - t0 < 15
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and addr in err[0]


def test_sweep_yaml_grid_on_local_workers(traces, tiny_store, tmp_path, capsys):
    """The default path (a LocalCluster started by the sweep); arenas in every accepted form; ioreplay cells."""
    from workbench.sizes import arena_slots
    from workbench.sim.sweep import load_sweep

    grid = tmp_path / "grid.yaml"
    grid.write_text(f"workloads:\n  hot: {traces[0]}\n  local: {traces[1]}\npolicies: [lru, slru]\n"
                    "arenas: ['0.25', '25%', '12', 1MB]\nkind: replay\n")
    assert main(["sweep", "--grid", str(grid), "--out", str(tmp_path / "y"), "--workers", "1"]) == 0
    df = load_sweep(tmp_path / "y")
    assert len(df) == 2 * 2 * 4 and set(df.workload) == {"hot", "local"}
    for arena, slots in zip(df.arena, df.slots):
        assert slots == arena_slots(arena, 48, 1 << 16, 2)
    io = tmp_path / "io.yaml"
    io.write_text(f"traces: [{traces[0]}]\nkind: ioreplay\nstore: {tiny_store}\nmap_layers: spread\nmap_experts: modulo\n"
                  "arenas: ['0.5', '1.0']\npredictors: [none, oracle]\n")
    assert main(["sweep", "--grid", str(io), "--out", str(tmp_path / "io"), "--compute-ms", "0", "--workers", "1"]) == 0
    d = load_sweep(tmp_path / "io")
    assert len(d) == 4 and set(d.slots) == {8, 16}
    assert ((d.bytes_per_token > 0) == (d.slots == 8)).all()  # a full arena is preloaded, as the engine's is
    assert (d[d.slots == 16].misses == 0).all()
    assert (d.cache == "cold").all() and d.disk_lease.str.startswith("workbench-disk-").all()  # one cell per disk
    assert (d.disk_bytes >= 0).all() and (d.cache_bytes >= 0).all() and (d.disk_wait_s >= 0).all()  # apart
    from workbench.config import ArenaConfig
    from workbench.sim.ioreplay import replay_io
    from workbench.trace.schema import read_trace

    dec = read_trace(traces[0]).decode()
    plan = dict((t, s) for s, t in layer_plan([0, 1, 2], [0, 1], "spread"))
    distinct = {(plan[int(layer)], int(e) % 8) for layer, sel in zip(dec.layer, dec.selected) if int(layer) in plan
                for e in sel}
    cold = replay_io(traces[0], tiny_store, ArenaConfig("1.0", preload=False), compute_ms=0, progress=False,
                     map_layers="spread", map_experts="modulo", phase="decode")
    assert cold["misses"] == len(distinct)  # a cold full arena: compulsory misses only


def test_sweep_heatmap_slices(traces, tmp_path, cluster):
    from workbench.sim.sweep import Grid, load_sweep, sweep
    from workbench.viz import sweep as sv
    from workbench.viz.render import chart_spec, chart_title, spec_rows

    sweep(Grid(traces=list(traces), policies=["lru", "fifo", "slru"], arenas=["0.25", "0.5"], predictors=["none", "oracle"]),
          tmp_path / "h", scheduler=cluster.scheduler_address, progress=False)
    df = load_sweep(tmp_path / "h")
    one = sv.sweep_slice(df, "sync_misses", predictor="oracle", workload="zipf")
    assert len(one) == 6 and (one.cells == 1).all()
    both = sv.sweep_slice(df, "sync_misses", predictor="oracle")
    assert (both.cells == 2).all()
    lru = df[(df.predictor == "oracle") & (df.policy == "lru") & (df.arena == "0.5")].sync_misses.mean()
    assert both[(both.policy == "lru") & (both.arena == "0.5")].value.iloc[0] == lru
    spec = chart_spec(sv.slice_heatmap(df, "bytes_per_token", predictor="none"))
    assert spec_rows(spec) == 6 and "bytes per token" in chart_title(spec)
    with pytest.raises(ValueError, match="no sweep cells"):
        sv.sweep_slice(df, "sync_misses", predictor="d7")


def test_sweep_bad_input_fails_before_any_work(traces, tmp_path, capsys):
    out = tmp_path / "bad"
    assert main(["sweep", str(traces[0]), "--arena", "0.25,3XB", "--out", str(out)]) == 2
    assert "cannot read arena size '3XB'" in capsys.readouterr().err and not out.exists()
    assert main(["sweep", str(tmp_path / "missing.parquet"), "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    grid = tmp_path / "g.yaml"
    grid.write_text("traces: [x.parquet]\npolicy: [lru]\n")
    assert main(["sweep", "--grid", str(grid), "--out", str(out)]) == 2
    assert "unknown keys ['policy']" in capsys.readouterr().err
    assert main(["sweep", str(traces[0]), "--kind", "replay", "--gate", "confidence", "--out", str(out)]) == 2
    assert "simulate cells only" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("flags, words", [
    (["--lookahead", "x"], "--lookahead must be a whole number, got 'x'"),
    (["--lookahead", "0"], "--lookahead 0 is out of range"),
    (["--policy", "nosuch"], "--policy 'nosuch' is not known; give one of"),
    (["--policy", "static"], "give --hotlist FILE"),
    (["--workers", "-3"], "--workers -3 is out of range"),
    (["--workers", "0"], "--workers 0 is out of range"),
    (["--predictor", "d9"], "no predictor column pred_d9"),
    (["--compute-ms", "nan"], "--compute-ms must be a finite number"),
    (["--connect-timeout", "-5"], "--connect-timeout -5.0 is out of range"),
])
def test_sweep_flags_are_checked_before_any_worker(traces, tmp_path, capsys, flags, words):
    """issue 32 items 2 and 11: one line naming the flag, exit 2, nothing written, no cluster started."""
    out = tmp_path / "o"
    capsys.readouterr()
    assert main(["sweep", str(traces[0]), "--out", str(out)] + flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and "starting" not in err[0] and not out.exists()


def test_sweep_out_file_grid_distances_and_hotlist_are_one_line(traces, tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("mine")
    capsys.readouterr()
    assert main(["sweep", str(traces[0]), "--out", str(f)]) == 2
    assert "--out" in capsys.readouterr().err and f.read_text() == "mine"
    grid = tmp_path / "g.yaml"
    grid.write_text(f"traces: [{traces[0]}]\npredictors: [d1]\ndistances: [two]\n")
    assert main(["sweep", "--grid", str(grid), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "distances must be a whole number, got 'two'" in err[0] and str(grid) in err[0]
    hot = tmp_path / "hot.txt"
    hot.write_text("0 99\n")  # expert 99 of a 16-expert trace
    assert main(["sweep", str(traces[0]), "--kind", "replay", "--policy", "static", "--hotlist", str(hot),
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hotlist" in err[0] and not (tmp_path / "o").exists()


@pytest.mark.parametrize("like", ["qwen3-30b-a3b", "mixtral-8x7b", "glm-4.5-air", "tiny"])
def test_synth_config_builds_the_real_model_with_these_experts(like):
    """The manifest's config and quantized map build the mlx-lm model (lazily) whose expert
    tensors have exactly the store's names and shapes (dtype: see --dtype; a fresh model is float32)."""
    from mlx.utils import tree_flatten

    from workbench.model import build_model, expert_modules, top_k_of
    from workbench.store.synth import expert_tensors, moe_layers, quantized_experts, synthetic_config

    shape = resolve_shape(like, layers=2)
    cfg = synthetic_config(shape, 4, like)
    model = build_model(cfg, quantized_experts(shape, 4))
    experts = expert_modules(model)
    assert sorted(experts) == moe_layers(shape) and top_k_of(cfg) == shape.top_k
    for layer in moe_layers(shape):
        path, module = experts[layer]
        assert path == f"model.layers.{layer}.{shape.expert_path}"
        got = [(n, tuple(a.shape)) for n, a in tree_flatten(module.parameters())]
        assert got == [(t["name"], (shape.experts, *t["shape"])) for t in expert_tensors(shape, 4)]
    f32 = expert_tensors(shape, 4, "float32")
    assert [str(a.dtype).split(".")[-1] for _, a in tree_flatten(experts[moe_layers(shape)[0]][1].parameters())] == \
        [t["dtype"] for t in f32]


def test_the_engine_refuses_a_synthetic_store_in_one_line(tiny_store, capsys):
    capsys.readouterr()
    assert main(["run", str(tiny_store), "--prompt-ids", "1,2", "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "resident.safetensors" in err[0]  # no resident weights: ioreplay only


@pytest.fixture()
def real_cluster(tmp_path):
    """A `dask scheduler` and a `dask worker` process, as a user starts them on a cluster's machines."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    import workbench

    env = dict(os.environ, PYTHONPATH=str(Path(workbench.__file__).resolve().parents[1]))
    sched_file = tmp_path / "scheduler.json"
    common = ["--no-dashboard"]
    procs = [subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--scheduler-file", str(sched_file)] + common, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 20
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        address = json.loads(sched_file.read_text())["address"]
        procs.append(subprocess.Popen([sys.executable, "-m", "dask", "worker", address, "--nthreads", "1",
                                       "--no-nanny", "--name", "w0"] + common, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path))
        yield address
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def test_sweep_on_a_real_scheduler_and_worker_with_url_paths(real_cluster, traces, tmp_path, capsys):
    """A hand-started scheduler and worker (separate processes), traces and results as file:// URLs: the
    rows equal the library's, and a rerun skips every cell."""
    from workbench.sim.replay import replay
    from workbench.sim.sweep import load_sweep

    out = f"file://{tmp_path / 'remote'}"
    args = ["sweep", f"file://{traces[0]}", "--kind", "replay", "--policy", "lru,fifo", "--arena", "6,12",
            "--out", out, "--scheduler", real_cluster, "--connect-timeout", "20"]
    assert main(args) == 0
    assert "4 cells run, 0 already done" in capsys.readouterr().out
    df = load_sweep(out)
    assert len(df) == 4 and df.worker.nunique() == 1 and not df.worker.iloc[0] == "local"
    for r in df.itertuples():
        assert r.hits == replay(traces[0], r.policy, int(r.arena)).hits
    assert main(args) == 0
    assert "0 cells run, 4 already done" in capsys.readouterr().out


def test_a_worker_reads_each_trace_once_and_checks_its_content(traces, tmp_path):
    import shutil

    from workbench.sim import sweep as sw
    from workbench.trace.schema import TraceError

    t = tmp_path / "t.parquet"
    shutil.copy(traces[0], t)
    sha = sw._sha256(t)
    first = sw.worker_trace(str(t), sha)
    assert sw.worker_trace(str(t), sha) is first  # kept: the second cell of this trace reads nothing
    sw._TRACES.clear()
    url = sw.worker_trace(f"file://{t}", sha)  # a URL trace: fetched once into the temp dir under its hash
    assert url is not first and url["trace"].routes.equals(first["trace"].routes)
    with pytest.raises(TraceError, match="not the trace the client hashed"):
        sw.worker_trace(str(traces[1]), "f" * 64)
    with pytest.raises(TraceError, match="cannot read trace .* need the trace at this path"):
        sw.worker_trace(str(tmp_path / "gone.parquet"), "e" * 64)


def test_a_cell_is_its_latest_ok_row_else_its_latest_failure():
    import pandas as pd

    from workbench.sim.sweep_data import finished

    df = pd.DataFrame({"cell_id": ["a", "a", "b", "b", "c"], "status": ["ok", "failed", "failed", "failed", "ok"],
                       "finished_at": [1.0, 2.0, 2.0, 1.0, 5.0], "error": [None, "x", "late", "early", None]})
    got = finished(df).set_index("cell_id")
    assert got.status.to_dict() == {"a": "ok", "b": "failed", "c": "ok"} and got.error["b"] == "late"


def test_batches_shrink_as_the_grid_goes_costliest_first():
    """Every cell in exactly one batch, one trace per batch, never more than ``most`` cells; with
    several workers the costliest cells first (each ds4 cell, 4.9 LRU cells, alone) and batches
    shrinking as the grid goes, so 8 workers start every ds4 cell at once and end on small batches,
    evenly; one worker: a batch per trace. Greedy list scheduling of the batches, as Dask runs them,
    ends within 10% of a perfect share of the estimated cost (it was 23% with equal batches)."""
    from workbench.sim.sweep import batches, cell_cost

    policies = ["lru", "fifo", "lfu", "slru", "s3fifo", "twohit", "ds4"]
    cells = [dict(trace_sha256=t, policy=p, arena=a, cell_id=f"{t}{p}{a}") for t in "ab" for p in policies
             for a in ("0.1", "0.25", "0.5")]
    cost = lambda b: sum(map(cell_cost, b))  # noqa: E731
    for n in (1, 2, 8):
        parts = batches(cells, n_workers=n)
        assert sorted(c["cell_id"] for b in parts for c in b) == sorted(c["cell_id"] for c in cells)
        assert all(len({c["trace_sha256"] for c in b}) == 1 for b in parts)
        ends = [0.0] * n
        for b in parts:  # each batch to the worker that is free first
            ends[ends.index(min(ends))] += cost(b)
        assert max(ends) <= 1.1 * sum(map(cell_cost, cells)) / n, (n, ends)
    assert len(batches(cells, n_workers=1)) == 2  # one per trace
    parts = batches(cells, n_workers=8)
    assert [b[0]["policy"] for b in parts[:6]] == ["ds4"] * 6 and [len(b) for b in parts[:6]] == [1] * 6
    assert max(map(cost, parts[-8:])) < min(map(cost, parts[:14]))  # the last batch a worker takes is small
    assert max(len(b) for b in batches(cells * 100, n_workers=1, most=50)) <= 50
