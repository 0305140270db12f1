"""Policy sweeps on Dask: a grid of replay / simulate / ioreplay cells, one Parquet file per cell.

    grid = Grid(traces=["a.parquet"], policies=["lru", "fifo"], arenas=["0.25", "2GB"])
    sweep(grid, "out/", workers=2)             # a LocalCluster of worker processes
    sweep(grid, "out/", scheduler="tcp://...")  # an existing cluster, same code path
    load_sweep("out/")                          # one row per cell

Each cell calls the library function its command calls (``sim.replay.replay``,
``sim.vtime.simulate``, ``sim.ioreplay.replay_io``). A cell's id hashes its configuration;
its row is written atomically to ``DIR/cell-<id>.parquet`` as soon as it finishes, so a
rerun skips what is done. Workers need the traces (and store) at the same paths.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from ..config import AheadConfig, ArenaConfig, IOConfig

KINDS = ("simulate", "replay", "ioreplay")
CONFIG = ("kind", "workload", "trace", "policy", "arena", "predictor", "distance", "gate")
TIMING_KEYS = ("compute_s", "pre_moe_s", "read_latency_s", "bandwidth", "workers", "urgent_workers", "piece_bytes", "expert_bytes")


class SweepError(RuntimeError):
    """A sweep could not run or finish: one line naming the cell or the cluster."""


@dataclass
class Grid:
    """The axes of a sweep; every combination is one cell (axes a kind ignores collapse)."""

    traces: list  # paths, or (workload name, path) pairs
    policies: list = field(default_factory=lambda: ["lru"])
    arenas: list = field(default_factory=lambda: ["0.25"])
    predictors: list = field(default_factory=lambda: ["none"])
    distances: list = field(default_factory=lambda: [None])
    gates: list = field(default_factory=lambda: ["none"])
    kind: str = "simulate"
    timing: dict = field(default_factory=dict)  # simulate: Timing fields
    store: str | None = None  # ioreplay: the store
    io_mode: str = "buffered"
    map_layers: str | None = None
    map_experts: str | None = None

    @classmethod
    def from_yaml(cls, path, **overrides) -> "Grid":
        """A grid from a YAML file (keys: the field names, ``workloads`` as name: path); ``overrides`` win."""
        import yaml

        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ValueError(f"grid file {path} cannot be read ({e}); fix the YAML") from None
        if not isinstance(data, dict):
            raise ValueError(f"grid file {path} must be a mapping of axis names to lists")
        if "workloads" in data:
            wl = data.pop("workloads")
            if not isinstance(wl, dict):
                raise ValueError(f"grid file {path}: workloads must map names to trace paths")
            data["traces"] = list(data.get("traces") or []) + [(str(k), str(v)) for k, v in wl.items()]
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"grid file {path} has unknown keys {sorted(unknown)}; valid: {', '.join(cls.__dataclass_fields__)}")
        for k, v in data.items():
            if k in ("traces", "policies", "arenas", "predictors", "distances", "gates") and not isinstance(v, list):
                data[k] = [v]
        here = path.parent
        rel = lambda p: str(p) if Path(p).is_absolute() else str(here / p)  # noqa: E731
        data["traces"] = [(t[0], rel(t[1])) if isinstance(t, (list, tuple)) else rel(t) for t in data.get("traces") or []]
        if data.get("store"):
            data["store"] = rel(data["store"])
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**data)

    def cells(self) -> list[dict]:
        """Every cell's configuration (a flat dict), in grid order, without duplicates."""
        if self.kind not in KINDS:
            raise ValueError(f"unknown sweep kind {self.kind!r}; valid: {', '.join(KINDS)}")
        if not self.traces:
            raise ValueError("a sweep needs at least one trace")
        if self.kind == "ioreplay" and not self.store:
            raise ValueError("an ioreplay sweep needs a store (--store DIR)")
        if self.kind != "simulate" and any(g != "none" for g in self.gates):
            raise ValueError(f"admission gates apply to simulate cells only, not {self.kind}")
        if self.kind == "replay" and any(p != "none" for p in self.predictors):
            raise ValueError("replay cells have no read-ahead; use --kind simulate (or ioreplay) for predictors")
        unknown = set(self.timing) - set(TIMING_KEYS)
        if unknown:
            raise ValueError(f"unknown timing keys {sorted(unknown)}; valid: {', '.join(TIMING_KEYS)}")
        traces = [(t if isinstance(t, (tuple, list)) else (Path(t).stem, t)) for t in self.traces]
        out, seen = [], set()
        for (name, path), pol, arena, pred, dist, gate in itertools.product(
                traces, self.policies, self.arenas, self.predictors, self.distances, self.gates):
            pred = "none" if pred in (None, "none") else str(pred)
            if pred == "none":
                dist, gate = None, "none"
            cell = dict(kind=self.kind, workload=str(name), trace=str(Path(path).resolve()), policy=str(pol),
                        arena=str(arena), predictor=pred, distance=None if dist in (None, "none") else int(dist), gate=str(gate))
            if self.kind == "simulate":
                cell["timing"] = dict(self.timing)
            if self.kind == "ioreplay":
                cell.update(store=str(Path(self.store).resolve()), io_mode=self.io_mode, map_layers=self.map_layers,
                            map_experts=self.map_experts, compute_ms=self.timing.get("compute_s", None) and self.timing["compute_s"] * 1e3)
            cell["cell_id"] = cell_id(cell)
            if cell["cell_id"] not in seen:
                seen.add(cell["cell_id"])
                out.append(cell)
        return out


def cell_id(cell: dict) -> str:
    body = {k: v for k, v in cell.items() if k != "cell_id"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cell_label(cell: dict) -> str:
    parts = [f"{k}={cell[k]}" for k in CONFIG if cell.get(k) not in (None, "none") and k != "trace"]
    return f"cell {cell['cell_id']} ({', '.join(parts)})"


def _slots(arena, trace) -> int:
    """Slots for any accepted --arena form (fraction, %, count, size), by the engine's one parser."""
    from ..sizes import arena_slots

    meta = trace.meta
    n_routed = max(1, len(trace.moe_layers)) * int(meta["n_experts"])
    return arena_slots(arena, n_routed, int(meta.get("expert_bytes") or 1), int(meta.get("top_k") or 1))


def run_cell(cell: dict) -> dict:
    """Run one cell (on a worker) and return its row: configuration, counters, timing."""
    from ..trace.schema import read_trace

    t0 = time.perf_counter()
    trace = read_trace(cell["trace"])
    row = {k: v for k, v in cell.items() if k != "timing"}  # the whole configuration, flat
    row.update({f"timing_{k}": v for k, v in (cell.get("timing") or {}).items()})
    if cell["kind"] == "replay":
        from .replay import replay

        slots = _slots(cell["arena"], trace)
        r = replay(trace, cell["policy"], slots, phase="decode")
        tokens = int(trace.decode().step.nunique())
        row.update(slots=slots, tokens=tokens, **{k: v for k, v in r.to_dict().items() if k != "policy"})
        row["bytes_per_token"] = r.misses * int(trace.meta.get("expert_bytes") or 0) / max(1, tokens)
    elif cell["kind"] == "simulate":
        from .vtime import Timing, simulate

        slots = _slots(cell["arena"], trace)
        res = simulate(trace, ArenaConfig(slots, cell["policy"]), _ahead(cell), timing=Timing(**cell["timing"]))
        s = res.summary
        row.update(slots=slots, **{k: v for k, v in s.items() if not isinstance(v, dict) and k != "policy"})
        row.update({f"prefetch_{k}": v for k, v in s["prefetch"].items()})
        row["bytes_per_token"] = s["bytes_read"] / max(1, s["tokens"])
    else:
        from .ioreplay import replay_io

        s = replay_io(trace, cell["store"], arena=ArenaConfig(cell["arena"], cell["policy"]),
                      io=IOConfig(mode=cell["io_mode"], verify="never"), ahead=_ahead(cell),
                      compute_ms=cell.get("compute_ms"), progress=False, map_layers=cell.get("map_layers"),
                      map_experts=cell.get("map_experts"))
        row.update(slots=s["arena_slots"], **{k: v for k, v in s.items() if not isinstance(v, dict) and k not in row and k != "policy"})
        row.update({f"prefetch_{k}": v for k, v in s["prefetch"].items()})
    row["cell_s"] = time.perf_counter() - t0
    row["worker"] = _worker_name()
    row.pop("warning", None)
    return row


def _ahead(cell: dict) -> AheadConfig:
    """A cell's read-ahead (``distance`` None: the predictor's default)."""
    if cell["predictor"] == "none":
        return AheadConfig()
    return AheadConfig(cell["predictor"], cell["distance"], gate=cell["gate"])


def _worker_name() -> str:
    try:
        from dask.distributed import get_worker

        return str(get_worker().address)
    except (ImportError, ValueError):
        return "local"


def cell_path(out: Path, cid: str) -> Path:
    return Path(out) / f"cell-{cid}.parquet"


def done_ids(out) -> set:
    return {p.stem[5:] for p in Path(out).glob("cell-*.parquet")}


def write_row(out, row: dict) -> Path:
    """Write one cell's row atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..fsutil import atomic_write

    path = cell_path(out, row["cell_id"])
    table = pa.Table.from_pandas(pd.DataFrame([row]), preserve_index=False)
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))
    return path


def load_sweep(out) -> pd.DataFrame:
    """All finished cells of a sweep directory, one row each; a bad file raises ValueError naming it."""
    import pyarrow.parquet as pq

    out = Path(out)
    if not out.is_dir():
        raise ValueError(f"sweep {out} does not exist; run `workbench sweep ... --out {out}` first")
    frames = []
    for p in sorted(out.glob("cell-*.parquet")):
        try:
            df = pq.read_table(p).to_pandas()
        except Exception as e:  # pyarrow raises several types for bad files
            raise ValueError(f"sweep cell {p} is not readable Parquet ({e}); delete it and rerun the sweep") from None
        missing = [c for c in ("cell_id", "kind", "policy", "arena") if c not in df.columns]
        if missing or len(df) != 1:
            raise ValueError(f"sweep cell {p} is malformed (missing {missing}, {len(df)} rows); delete it and rerun the sweep")
        frames.append(df)
    if not frames:
        raise ValueError(f"sweep {out} has no finished cells")
    return pd.concat(frames, ignore_index=True)


@dataclass
class SweepResult:
    total: int
    skipped: int
    ran: int
    seconds: float
    out: Path

    def to_dict(self):
        d = asdict(self)
        d["out"] = str(self.out)
        return d


def check_cells(cells) -> None:
    """Read every trace (and store) once and size every arena here, so bad input fails before any work."""
    from ..sizes import arena_slots
    from ..store.manifest import Manifest
    from ..trace.schema import read_trace

    traces, stores = {}, {}
    for c in cells:
        if c["trace"] not in traces:
            traces[c["trace"]] = read_trace(c["trace"])
        if c["kind"] == "ioreplay":
            if c["store"] not in stores:
                stores[c["store"]] = Manifest.load(c["store"])
            m = stores[c["store"]]
            arena_slots(c["arena"], m.n_routed, m.expert_bytes, m.top_k)
        else:
            _slots(c["arena"], traces[c["trace"]])


def open_client(workers: int | None = None, scheduler: str | None = None, timeout: float = 5.0):
    """(client, cluster or None): a LocalCluster of ``workers`` processes on 127.0.0.1, or ``scheduler``."""
    import logging

    from dask.distributed import Client, LocalCluster

    if scheduler:
        try:
            return Client(scheduler, timeout=timeout), None
        except (OSError, TimeoutError, ValueError) as e:
            raise SweepError(f"cannot reach the Dask scheduler at {scheduler} ({type(e).__name__}: {e}); "
                             f"start one (`dask scheduler`) or drop --scheduler to use local workers") from None
    cluster = LocalCluster(n_workers=workers or 2, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR)
    return Client(cluster), cluster


def sweep(grid: Grid, out, workers: int | None = None, scheduler: str | None = None, progress: bool = True,
          client=None) -> SweepResult:
    """Run every cell of ``grid`` not yet in ``out`` on Dask; rows are written as cells finish.

    A worker error cancels the rest and raises SweepError naming the cell; finished cells stay.
    """
    from dask.distributed import as_completed
    from tqdm.auto import tqdm

    out = Path(out)
    cells = grid.cells()
    check_cells(cells)
    out.mkdir(parents=True, exist_ok=True)
    done = done_ids(out)
    todo = [c for c in cells if c["cell_id"] not in done]
    t0 = time.perf_counter()
    if todo:
        own = client is None
        cluster = None
        if own:
            client, cluster = open_client(workers, scheduler)
        futures = {}
        try:
            futures = {client.submit(run_cell, c, key=f"sweep-cell-{c['cell_id']}", pure=False): c for c in todo}
            with tqdm(total=len(cells), initial=len(cells) - len(todo), desc="sweep", unit="cell", disable=not progress) as bar:
                for fut in as_completed(futures):
                    cell = futures[fut]
                    try:
                        row = fut.result()
                    except Exception as e:  # any worker failure ends the sweep with one line
                        client.cancel(list(futures))
                        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
                        raise SweepError(f"{cell_label(cell)} failed: {type(e).__name__}: {msg}") from None
                    write_row(out, row)
                    bar.update(1)
        finally:
            if own:
                client.close()
                if cluster is not None:
                    cluster.close()
    return SweepResult(total=len(cells), skipped=len(cells) - len(todo), ran=len(todo), seconds=time.perf_counter() - t0, out=out)
