"""Policy sweeps on Dask: a grid of replay / simulate / ioreplay cells, results in one Parquet dataset.

    grid = Grid(traces=["a.parquet"], policies=["lru", "fifo"], arenas=["0.25", "2GB"])
    sweep(grid, "out/")                          # a LocalCluster sized to this machine
    sweep(grid, "out/", scheduler="tcp://...")   # an existing cluster, same code path
    load_sweep("out/")                           # one row per cell

Each cell calls the library function its command calls (``sim.replay.replay``, ``sim.vtime.simulate``,
``sim.ioreplay.replay_io``) with the same defaults (``phase`` all, as the commands). A cell's id hashes
its whole configuration: the trace's *content* (sha256), the workbench version and every setting, so a
re-recorded trace reruns and a moved one does not. Cells go to workers in batches; a worker loads each
trace once and keeps it (``_TRACES``). A batch's rows come back when it ends, and the rows of ended
batches are appended as one part file (``sweep_data``) at most every ``APPEND_S`` seconds, at the end
and when the sweep stops (parts of a few rows each cost more to write than short cells take); a killed
client reruns the batches running then and those ended since the last part. A failing cell is
recorded with its error and the sweep goes on; a rerun runs the failed and missing cells only. ioreplay cells take one lease per disk (a Dask Semaphore named by host and
device), so concurrent cells never share a disk, and start cold (the store's pages dropped).

Paths: local paths (made absolute) or fsspec URLs (``file://``, ``s3://``, ``gs://``). The client
hashes each trace and reads its Parquet footer; workers read traces themselves (a worker that cannot
see a path says so). Stores are local files on each worker (an SSD per worker is what ioreplay measures).
"""

from __future__ import annotations

import itertools
import os
import time
import uuid
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from ..checks import one_of, parse_whole, whole
from .sweep_data import check_out, config_hash, encode_part, finished, is_url, read_parts, set_aside, write_part

KINDS = ("simulate", "replay", "ioreplay")
PHASES = ("all", "decode")  # the phases every kind replays; all is each command's default
CACHES = ("cold", "warm")  # ioreplay: the store's pages dropped before the cell, or left as they are
CONFIG = ("kind", "workload", "policy", "arena", "predictor", "distance", "gate", "phase")
TIMING_KEYS = ("compute_s", "pre_moe_s", "read_latency_s", "bandwidth", "workers", "urgent_workers", "piece_bytes", "expert_bytes")
AXES = ("traces", "policies", "arenas", "predictors", "distances", "gates")
AXIS_FLAGS = {"policies": "--policy", "arenas": "--arena", "predictors": "--predictor", "gates": "--gate"}
MAX_WORKERS = 4096
CONNECT_TIMEOUT = 10.0
APPEND_S = 2.0  # finished rows are appended as one part at most this often (and at the end)
# The local cluster's Dask settings: no statistical profiler (it samples every worker's stack each 10 ms)
# and slower monitors. Idle, a 2-worker cluster then takes about 4% of a core instead of 16% (a sweep's
# cells would share those cores; measured with psutil, dask 2026.8).
LOCAL_DASK = {"distributed.worker.profile.enabled": False, "distributed.admin.system-monitor.gil.enabled": False,
              "distributed.admin.tick.interval": "100ms", "distributed.worker.memory.monitor-interval": "1s"}


class SweepError(RuntimeError):
    """A sweep could not run: one line naming the cluster or the input."""


@dataclass
class Grid:
    """The axes of a sweep; every combination is one cell (axes a kind ignores collapse)."""

    traces: list  # paths or URLs, or (workload name, path) pairs
    policies: list = field(default_factory=lambda: ["lru"])
    arenas: list = field(default_factory=lambda: ["0.25"])
    predictors: list = field(default_factory=lambda: ["none"])
    distances: list = field(default_factory=lambda: [None])
    gates: list = field(default_factory=lambda: ["none"])
    kind: str = "simulate"
    phase: str = "all"
    timing: dict = field(default_factory=dict)  # simulate: Timing fields
    hotlist: str | None = None  # policy static: the hotlist file (KEY or LAYER EXPERT per line)
    store: str | None = None  # ioreplay: the store
    io_mode: str = "buffered"
    cache: str = "cold"
    map_layers: str | None = None
    map_experts: str | None = None

    @classmethod
    def from_yaml(cls, path, **overrides) -> "Grid":
        """A grid from a YAML file (keys: the field names, ``workloads`` as name: path); ``overrides`` win."""
        import yaml

        from ..checks import read_text

        path = Path(path)
        try:
            data = yaml.safe_load(read_text("grid file", path)) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"grid file {path} is not valid YAML ({str(e).splitlines()[0]}); fix the YAML") from None
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
            if k in AXES and not isinstance(v, list):
                data[k] = [v]
        here = path.parent
        rel = lambda p: str(p) if is_url(p) or Path(p).is_absolute() else str(here / p)  # noqa: E731
        data["traces"] = [(t[0], rel(t[1])) if isinstance(t, (list, tuple)) else rel(t) for t in data.get("traces") or []]
        for key in ("store", "hotlist"):
            if data.get(key):
                data[key] = rel(data[key])
        data.update({k: v for k, v in overrides.items() if v is not None})
        grid = cls(**data)
        grid.where = f"grid file {path}"
        return grid

    def check(self) -> None:
        """The axes' own values (names, numbers); ValueError naming the flag or grid key."""
        where = getattr(self, "where", None)
        name = lambda flag, key: f"{where}: {key}" if where else flag  # noqa: E731
        one_of(name("--kind", "kind"), self.kind, KINDS)
        one_of(name("--phase", "phase"), self.phase, PHASES)
        one_of(name("--cache", "cache"), self.cache, CACHES)
        if self.kind == "ioreplay":
            from ..config import READ_MODES

            one_of(name("--io-mode", "io_mode"), self.io_mode, READ_MODES)
        if not self.traces:
            raise ValueError("a sweep needs at least one trace: give TRACE files or a --grid file with traces")
        for key, flag in AXIS_FLAGS.items():
            if not getattr(self, key):
                raise ValueError(f"{name(flag, key)} is empty; give at least one value")
        self.distances = [None if d in (None, "none") else parse_whole(name("--lookahead", "distances"), d, 1)
                          for d in self.distances]
        from ..arena.policies.base import POLICIES, load_all

        load_all()
        for p in self.policies:
            one_of(name("--policy", "policies"), str(p), sorted(POLICIES))
        if "static" in self.policies and not self.hotlist:
            raise ValueError("--policy static pins the experts of a hotlist; give --hotlist FILE (KEY or LAYER EXPERT per line)")
        if self.kind == "ioreplay" and not self.store:
            raise ValueError("an ioreplay sweep needs a store (--store DIR)")
        if self.kind != "simulate" and any(g != "none" for g in self.gates):
            raise ValueError(f"admission gates apply to simulate cells only, not {self.kind}")
        if self.kind == "replay" and any(p != "none" for p in self.predictors):
            raise ValueError("replay cells have no read-ahead; use --kind simulate (or ioreplay) for predictors")
        unknown = set(self.timing) - set(TIMING_KEYS)
        if unknown:
            raise ValueError(f"unknown timing keys {sorted(unknown)}; valid: {', '.join(TIMING_KEYS)}")

    def cells(self) -> list[dict]:
        """Every cell (configuration + paths), in grid order, without duplicates; every input checked first."""
        from .. import __version__ as version

        self.check()
        traces = [_trace_info(name, path) for name, path in
                  ((t if isinstance(t, (tuple, list)) else (Path(str(t)).stem, t)) for t in self.traces)]
        store = _store_info(self.store) if self.kind == "ioreplay" else None
        hot = _hotlist(self.hotlist) if self.hotlist else None
        out, seen = [], set()
        for tr, pol, arena, pred, dist, gate in itertools.product(
                traces, self.policies, self.arenas, self.predictors, self.distances, self.gates):
            pred = "none" if pred in (None, "none") else str(pred)
            if pred == "none":
                dist, gate = None, "none"
            config = dict(kind=self.kind, workload=tr["name"], trace_sha256=tr["sha256"], policy=str(pol), arena=str(arena),
                          predictor=pred, distance=dist, gate=str(gate), phase=self.phase, workbench=version)
            if pol == "static":
                config["hotlist_sha256"] = hot["sha256"]
            if self.kind == "simulate":
                config["timing"] = dict(self.timing)
            if self.kind == "ioreplay":
                config.update(store_sha256=store["sha256"], io_mode=self.io_mode, cache=self.cache, map_layers=self.map_layers,
                              map_experts=self.map_experts, compute_ms=self.timing.get("compute_s", None) and self.timing["compute_s"] * 1e3)
            cid, text = config_hash(config)
            if cid in seen:
                continue
            seen.add(cid)
            cell = dict(config, cell_id=cid, config_json=text, trace=tr["path"], store=store and store["path"],
                        hotlist_keys=hot["keys"] if pol == "static" else None)
            _check_cell(cell, tr, store)
            out.append(cell)
        return out


# --- the client: what each input is, checked before any worker runs ------------------------

def _norm(path) -> str:
    return str(path) if is_url(path) else str(Path(path).resolve())


def _open(path):
    import fsspec

    return fsspec.open(path, "rb").open() if is_url(path) else open(path, "rb")


def _sha256(path) -> str:
    import hashlib

    h = hashlib.sha256()
    with _open(path) as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _trace_info(name, path) -> dict:
    """A trace's content hash and footer (metadata, columns): the client never loads its rows."""
    import pyarrow.parquet as pq

    from ..trace.schema import TraceError, trace_meta

    path = _norm(path)
    if not is_url(path):
        from ..checks import input_file

        try:
            input_file("trace", path, fix="record one with `workbench run ... --trace FILE`")
        except ValueError as e:
            raise TraceError(str(e)) from None
    try:
        with _open(path) as f:
            schema = pq.read_schema(f)
        sha = _sha256(path)
    except FileNotFoundError:
        raise TraceError(f"trace {path} does not exist; record one with `workbench run ... --trace FILE`") from None
    except Exception as e:  # pyarrow and fsspec raise several types
        raise TraceError(f"trace {path} cannot be read as Parquet ({type(e).__name__}: {str(e)[:120]}); give a workbench trace") from None
    meta = trace_meta(schema.metadata, f"trace {path}")
    return dict(name=str(name), path=path, sha256=sha, meta=meta, columns=set(schema.names))


def _store_info(store) -> dict:
    from ..store.manifest import MANIFEST, Manifest

    path = str(Path(store).resolve())
    m = Manifest.load(path)
    return dict(path=path, manifest=m, sha256=_sha256(Path(path) / MANIFEST))


def _hotlist(path) -> dict:
    from ..arena.policies.hotlist import load_hotlist
    from ..checks import input_file

    input_file("--hotlist", path)
    return dict(sha256=_sha256(path), keys=load_hotlist(path))


def _check_cell(cell, tr, store) -> None:
    """Size the arena, build the policy and find the predictor for one cell, as its worker will."""
    from ..arena.policies.base import make_policy
    from ..sizes import arena_slots
    from .vtime import _distance_for

    meta = tr["meta"]
    if store is not None:
        m = store["manifest"]
        slots = arena_slots(cell["arena"], m.n_routed, m.expert_bytes, m.top_k)
    else:
        slots = _slots(cell["arena"], meta)
    n_keys = (max(int(x) for x in meta["moe_layers"]) + 1) * int(meta["n_experts"])
    opts = {"keys": cell["hotlist_keys"]} if cell["policy"] == "static" else {}
    try:
        make_policy(cell["policy"], slots, n_keys=n_keys, n_experts=int(meta["n_experts"]), **opts)
    except ValueError as e:
        raise ValueError(f"{cell_label(cell)}: {e}") from None
    pred = cell["predictor"]
    if pred != "none":
        if pred != "oracle" and f"pred_{pred}" not in tr["columns"]:
            have = sorted(c[5:] for c in tr["columns"] if c.startswith("pred_")) + ["oracle"]
            raise ValueError(f"trace {tr['path']} has no predictor column pred_{pred} (--predictor {pred}); "
                             f"its predictors: {', '.join(have)}")
        if cell["kind"] == "simulate":
            _distance_for(pred, cell["distance"], meta, len(meta["moe_layers"]) or 1)


def cell_label(cell: dict) -> str:
    parts = [f"{k}={cell[k]}" for k in CONFIG if cell.get(k) not in (None, "none")]
    return f"cell {cell['cell_id']} ({', '.join(parts)})"


def _slots(arena, meta) -> int:
    """Slots for any accepted --arena form (fraction, %, count, size), by the engine's one parser."""
    from ..sizes import arena_slots

    n_routed = max(1, len(meta["moe_layers"])) * int(meta["n_experts"])
    return arena_slots(arena, n_routed, int(meta.get("expert_bytes") or 1), int(meta.get("top_k") or 1))


# --- the worker: each trace loaded once, cells in batches, a failing cell recorded ------------

_TRACES: OrderedDict = OrderedDict()  # this worker process's traces by content hash (the newest few)
KEEP_TRACES = 4


def worker_trace(path: str, sha: str):
    """The trace of content ``sha`` at ``path``, read once per worker process and kept."""
    from ..trace.schema import TraceError, read_trace

    if sha in _TRACES:
        _TRACES.move_to_end(sha)
        return _TRACES[sha]
    try:
        got = _sha256(path)
    except OSError as e:
        raise TraceError(f"worker {_worker_name()} cannot read trace {path} ({e.strerror or e}); the client and every "
                         "worker need the trace at this path: use a shared folder or an fsspec URL (s3://...)") from None
    if got != sha:
        raise TraceError(f"trace {path} on worker {_worker_name()} is not the trace the client hashed (its content differs); "
                         "give every machine the same file")
    if is_url(path):
        import tempfile

        local = Path(tempfile.gettempdir()) / f"workbench-trace-{sha[:16]}.parquet"
        if not local.exists():
            import shutil

            from ..fsutil import atomic_write

            def fetch(tmp):
                with _open(path) as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 22)
            atomic_write(local, fetch)
        trace = read_trace(local)
    else:
        trace = read_trace(path)
    _TRACES[sha] = {"trace": trace, "requests": {}}
    while len(_TRACES) > KEEP_TRACES:
        _TRACES.popitem(last=False)
    return _TRACES[sha]


def run_cell(cell: dict) -> dict:
    """Run one cell (on a worker) and return its row: configuration, counters, timing."""
    from ..config import AheadConfig, ArenaConfig, IOConfig

    t0 = time.perf_counter()
    entry = worker_trace(cell["trace"], cell["trace_sha256"])
    trace = entry["trace"]
    row = _config_row(cell)
    row.update({f"timing_{k}": v for k, v in (cell.get("timing") or {}).items()})
    opts = {"keys": cell["hotlist_keys"]} if cell["policy"] == "static" else {}
    ahead = AheadConfig() if cell["predictor"] == "none" else AheadConfig(cell["predictor"], cell["distance"], gate=cell["gate"])
    if cell["kind"] == "replay":
        row.update(_replay_row(cell, entry, opts))
    elif cell["kind"] == "simulate":
        from .vtime import Timing, simulate

        slots = _slots(cell["arena"], trace.meta)
        res = simulate(trace, ArenaConfig(slots, cell["policy"], opts or None), ahead, timing=Timing(**cell["timing"]),
                       phase=cell["phase"])
        s = res.summary
        row.update(slots=slots, **{k: v for k, v in s.items() if not isinstance(v, dict) and k != "policy"})
        row.update({f"prefetch_{k}": v for k, v in s["prefetch"].items()})
        row["bytes_per_token"] = s["bytes_read"] / max(1, s["tokens"])
    else:
        from .ioreplay import replay_io

        with _disk_lease(cell["store"]) as lease:
            s = replay_io(trace, cell["store"], arena=ArenaConfig(cell["arena"], cell["policy"], opts or None),
                          io=IOConfig(mode=cell["io_mode"], verify="never"), ahead=ahead, compute_ms=cell.get("compute_ms"),
                          progress=False, map_layers=cell.get("map_layers"), map_experts=cell.get("map_experts"),
                          phase=cell["phase"], cache=cell["cache"])
        row.update(slots=s["arena_slots"], disk_lease=lease.name, disk_wait_s=lease.waited, **{k: v for k, v in s.items()
                                                                 if not isinstance(v, dict) and k not in row and k != "policy"})
        row.update({f"prefetch_{k}": v for k, v in s["prefetch"].items()})
    row.update(status="ok", error=None, cell_s=time.perf_counter() - t0, worker=_worker_name(), finished_at=time.time())
    row.pop("warning", None)
    return row


def _replay_row(cell, entry, opts) -> dict:
    """A replay cell: ``workbench replay --phase P``'s counts; bytes per token from the decode requests' misses."""
    import numpy as np

    from .replay import replay_keys
    from .requests import requests_from_trace

    trace, phase = entry["trace"], cell["phase"]
    if phase not in entry["requests"]:  # flattened once per worker and phase
        req = requests_from_trace(trace, phase=phase)
        decode_steps = np.unique(trace.decode().step.to_numpy())
        entry["requests"][phase] = (req, np.isin(req.step, decode_steps), len(decode_steps))
    req, is_decode, tokens = entry["requests"][phase]
    slots = _slots(cell["arena"], trace.meta)
    r = replay_keys(req.keys, cell["policy"], slots, token_end=req.token_end, n_keys=req.n_keys, n_experts=req.n_experts, **opts)
    decode_misses = int((~r.hit & is_decode).sum())
    d = {k: v for k, v in r.to_dict().items() if k != "policy"}
    return dict(slots=slots, tokens=tokens, decode_misses=decode_misses,
                bytes_per_token=decode_misses * int(trace.meta.get("expert_bytes") or 0) / max(1, tokens), **d)


def run_batch(cells: list) -> list:
    """Run cells in order; a failing cell becomes a row with status failed and its error, the rest go on."""
    rows = []
    for cell in cells:
        _event("start", cell["cell_id"])
        try:
            rows.append(run_cell(cell))
        except Exception as e:  # recorded in the row, never the end of the sweep
            rows.append(_failed_row(cell, e, worker=_worker_name()))
        _event("end", cell["cell_id"])
    return rows


def _config_row(cell: dict) -> dict:
    """A cell's configuration as its row starts (its timing goes in as timing_* columns)."""
    return {k: v for k, v in cell.items() if k not in ("timing", "hotlist_keys")}


def _failed_row(cell: dict, e: BaseException, **extra) -> dict:
    """The row of a cell that failed: its configuration, status failed, the error's first line."""
    msg = (str(e).strip().splitlines() or [""])[0]
    return {**_config_row(cell), "status": "failed", "error": f"{type(e).__name__}: {msg}", **extra,
            "finished_at": time.time()}


class _disk_lease:
    """One ioreplay cell per disk at a time: a Dask Semaphore named by host and the store's device."""

    def __init__(self, store):
        import socket

        self.name = f"workbench-disk-{socket.gethostname()}-{os.stat(store).st_dev}"
        self.sem, self.waited = None, 0.0

    def __enter__(self):
        try:
            from dask.distributed import Semaphore, get_worker

            get_worker()
        except (ImportError, ValueError):
            self.name = "none (not on a Dask worker)"
            return self
        t0 = time.perf_counter()
        self.sem = Semaphore(max_leases=1, name=self.name)
        self.sem.acquire()
        self.waited = time.perf_counter() - t0  # seconds this cell waited for another cell on its disk
        return self

    def __exit__(self, *exc):
        if self.sem is not None:
            self.sem.release()


def _worker_name() -> str:
    try:
        from dask.distributed import get_worker

        return str(get_worker().address)
    except (ImportError, ValueError):
        return "local"


TOPIC = "workbench-sweep"


def _event(what, cid) -> None:
    try:
        from dask.distributed import get_worker

        get_worker().log_event(TOPIC, {"what": what, "cell": cid, "t": time.time()})
    except (ImportError, ValueError):
        pass


# --- the cluster ----------------------------------------------------------------------------

def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def probe_scheduler(address: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """Check that ``address`` is a Dask scheduler within ``timeout`` seconds: a TCP scheduler sends its
    handshake as soon as it accepts, so silence (an HTTP port such as the dashboard's) or other bytes
    (another service) are refused in one line, without Dask trying to parse them."""
    import socket

    if address.startswith(("tls://", "ws://", "wss://", "inproc://", "ucx://")):
        return  # encrypted or not TCP: Client's own timeout applies
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    try:
        port = int(port)
    except ValueError:
        raise SweepError(f"--scheduler {address} has no port; give an address like tcp://HOST:8786") from None
    host = host.strip("[]") or "127.0.0.1"
    try:
        so = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise SweepError(f"cannot reach the Dask scheduler at {address} ({e.strerror or type(e).__name__}); "
                         "start one (`dask scheduler`) or drop --scheduler to use local workers") from None
    data, t0 = b"", time.monotonic()
    try:
        while b"pickle-protocol" not in data and len(data) < 4096:
            so.settimeout(max(0.05, timeout - (time.monotonic() - t0)))
            chunk = so.recv(4096)
            if not chunk:
                break
            data += chunk
    except (socket.timeout, OSError):
        pass
    finally:
        so.close()
    if b"pickle-protocol" in data:
        return
    if not data:
        raise SweepError(f"--scheduler {address} accepted the connection but sent nothing in {timeout:g} s: it is not a "
                         "Dask scheduler (an HTTP port such as the dashboard's?); give the scheduler's port (default 8786)")
    raise SweepError(f"--scheduler {address} answered, but not as a Dask scheduler (it sent {data[:24]!r}); "
                     "give the address `dask scheduler` prints")


def open_client(workers: int | None = None, scheduler: str | None = None, timeout: float = CONNECT_TIMEOUT, log=None):
    """(client, cluster or None): a LocalCluster of ``workers`` processes (default: this machine's usable
    cores) on 127.0.0.1, or the scheduler at ``scheduler`` (checked within ``timeout`` s). ``log``: a
    function for the start-up lines (cluster start, dashboard)."""
    import logging

    import dask
    from dask.distributed import Client, LocalCluster

    log = log or (lambda text: None)
    t0 = time.perf_counter()
    if scheduler:
        probe_scheduler(scheduler, timeout)
        try:
            client = Client(scheduler, timeout=timeout)
        except (OSError, TimeoutError, ValueError) as e:
            raise SweepError(f"cannot reach the Dask scheduler at {scheduler} ({type(e).__name__}: {e}); "
                             f"start one (`dask scheduler`) or drop --scheduler to use local workers") from None
        n = len(client.scheduler_info().get("workers", {}))
        log(f"connected to {scheduler} ({n} workers); dashboard {client.dashboard_link}")
        return client, None
    workers = whole("--workers", workers if workers is not None else usable_cpus(), 1, MAX_WORKERS)
    log(f"starting {workers} local Dask worker{'s' * (workers > 1)} ...")
    with dask.config.set(LOCAL_DASK):  # read as the scheduler, nannies and workers start
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR)
        client = Client(cluster)
    log(f"{workers} workers up in {time.perf_counter() - t0:.1f} s; dashboard {client.dashboard_link}")
    return client, cluster


def _wait_for_workers(client, timeout) -> int:
    """Workers of the cluster; SweepError when it has none within ``timeout`` (a sweep would wait forever)."""
    try:
        client.wait_for_workers(1, timeout=timeout)
    except TimeoutError:
        raise SweepError(f"the Dask cluster at {client.scheduler.address} has no workers after {timeout:g} s; "
                         "start some (`dask worker ADDRESS`)") from None
    return len(client.scheduler_info()["workers"])


def cell_cost(cell: dict) -> float:
    """A cell's estimated cost against an LRU cell's on the same trace (its policy's ``replay_cost``)."""
    from ..arena.policies import POLICIES, load_all

    name = cell.get("policy")
    cls = POLICIES.get(name) or (load_all() or POLICIES.get(name))  # policies register as they are imported
    return getattr(cls, "replay_cost", 1.0)


def batches(cells: list, n_workers: int, per_worker: int = 2, most: int = 500) -> list:
    """Cells in batches, costliest first (Dask starts them in that order), at most ``most`` cells
    and one trace each. With several workers a batch closes once its estimated cost
    (``cell_cost``) reaches what is left over ``per_worker`` batches a worker (guided
    self-scheduling), and no sooner than a quarter of the grid's share: batches shrink as the grid
    goes on, so a costly cell never runs alone at the end and the last, small batches fill the
    workers' ends evenly, while a small grid is not cut into many batches that each cost a round
    trip. One worker: a batch a trace."""
    costs = {c["cell_id"]: cell_cost(c) for c in cells}
    cost = lambda c: costs[c["cell_id"]]  # noqa: E731
    left = total = sum(costs.values())
    shares = per_worker * n_workers if n_workers > 1 else 0
    out, open_ = [], {}  # open_: trace -> (estimated cost, batch) not closed yet
    for c in sorted(cells, key=cost, reverse=True):  # a stable sort: grid order among equals
        spent, batch = open_.pop(c["trace_sha256"], (0.0, []))
        batch.append(c)
        spent += cost(c)
        if (shares and spent >= max(left, total / 4) / shares) or len(batch) == most:
            out.append(batch)
            left -= spent
        else:
            open_[c["trace_sha256"]] = (spent, batch)
    return out + [b for _, b in sorted(open_.values(), key=lambda sb: -sb[0])]


# --- the sweep ------------------------------------------------------------------------------

@dataclass
class SweepResult:
    total: int
    skipped: int
    ran: int
    failed: int
    seconds: float
    out: str
    errors: list = field(default_factory=list)  # (cell label, error) of the failed cells

    def to_dict(self):
        return asdict(self)


def sweep(grid: Grid, out, workers: int | None = None, scheduler: str | None = None, progress: bool = True,
          client=None, timeout: float = CONNECT_TIMEOUT, log=None) -> SweepResult:
    """Run every cell of ``grid`` not yet finished in ``out`` on Dask (ended batches' rows: ``_append``).

    Every input is checked before a worker starts (ValueError / TraceError naming it); a cell that fails on
    its worker is recorded as failed (``load_sweep(out, failed=True)``) and reruns on the next sweep.
    """
    from dask.distributed import wait
    from tqdm.auto import tqdm

    log = log or (lambda text: None)
    out = str(out) if is_url(out) else str(Path(out).absolute())
    cells = grid.cells()
    check_out(out)
    if workers is not None:
        whole("--workers", workers, 1, MAX_WORKERS)
    notes = []
    have = finished(read_parts(out, on_bad=lambda fs, p, msg: notes.append(set_aside(fs, p, msg))))
    for note in notes:
        log(note)
    done = set(have.cell_id[have.status == "ok"])
    todo = [c for c in cells if c["cell_id"] not in done]
    t0 = time.perf_counter()
    rows_failed = []
    if todo:
        own = client is None
        cluster, unwritten = None, []
        if own:
            client, cluster = open_client(min(workers or usable_cpus(), len(todo)), scheduler, timeout, log)
        try:
            n_workers = _wait_for_workers(client, timeout)
            parts = batches(todo, n_workers)
            written = time.perf_counter()  # when finished rows were last appended (``unwritten``: those since)
            ended, running = set(), {}

            def on_event(event):
                _, msg = event
                (ended.add if msg["what"] == "end" else lambda c: running.__setitem__(c, msg["t"]))(msg["cell"])
                if msg["what"] == "end":
                    running.pop(msg["cell"], None)

            if progress:  # cells ending inside a batch move the bar
                client.subscribe_topic(TOPIC, on_event)
            run = uuid.uuid4().hex[:8]  # keys unique to this sweep: never a result Dask still holds from another
            pending = {client.submit(run_batch, b, key=f"sweep-{run}-batch-{i}-{b[0]['cell_id']}", pure=False): b
                       for i, b in enumerate(parts)}
            with tqdm(total=len(cells), initial=len(cells) - len(todo), desc="sweep", unit="cell", disable=not progress) as bar:
                while pending:
                    try:
                        finished_now = wait(list(pending), timeout=0.5, return_when="FIRST_COMPLETED").done
                    except TimeoutError:  # nothing ended in this half second: refresh the bar
                        finished_now = ()
                    for fut in finished_now:
                        batch = pending.pop(fut)
                        try:
                            rows = fut.result()
                        except Exception as e:  # the worker died or the batch could not run: record every cell
                            rows = [_failed_row(c, e) for c in batch]
                        unwritten.append((batch, rows))
                        ended.update(c["cell_id"] for c in batch)
                        rows_failed += [(cell_label(r), r["error"]) for r in rows if r["status"] != "ok"]
                    if unwritten and (not pending or time.perf_counter() - written >= APPEND_S):
                        rows_failed += _append(out, unwritten)
                        unwritten, written = [], time.perf_counter()
                    bar.n = len(cells) - len(todo) + len(ended & {c["cell_id"] for c in todo})
                    if running:
                        cid, since = min(running.items(), key=lambda kv: kv[1])
                        bar.set_postfix_str(f"{len(running)} running, longest {cid[:8]} {time.time() - since:.0f} s", refresh=False)
                    bar.refresh()
        finally:
            try:
                if unwritten:  # stopped (Ctrl-C, an error): the batches that ended are kept
                    _append(out, unwritten)
            finally:
                if own:
                    client.close()
                    if cluster is not None:
                        cluster.close()
    return SweepResult(total=len(cells), skipped=len(cells) - len(todo), ran=len(todo) - len(rows_failed),
                       failed=len(rows_failed), seconds=time.perf_counter() - t0, out=out, errors=rows_failed)


def _append(out, done) -> list:
    """Append the rows of ended batches (``done``: [(cells, rows)]) as one part. Where they do not
    encode together (a column's type differs between batches), a part a batch; a batch whose own rows
    do not encode is written as failed rows naming the error (it reruns). (label, error) of those."""
    try:
        parts, failed = [encode_part([r for _, rows in done for r in rows])], []
    except Exception:
        parts, failed = [], []
        for cells, rows in done:
            try:
                parts.append(encode_part(rows))
            except Exception as e:
                bad = [_failed_row(c, e) for c in cells]
                parts.append(encode_part(bad))
                failed += [(cell_label(r), r["error"]) for r in bad]
    for data in parts:
        write_part(out, data)
    return failed


def load_sweep(out, failed: bool = False) -> pd.DataFrame:
    """The sweep's cells, one row each (verified; the latest row of a rerun cell): finished cells, or with
    ``failed`` every cell including failed ones (``status``, ``error``). A bad part raises ValueError naming it."""
    from .sweep_data import out_fs

    fs, root = out_fs(out)
    if not fs.isdir(root):
        raise ValueError(f"sweep {out} does not exist; run `workbench sweep ... --out {out}` first")
    df = finished(read_parts(out))
    if not failed:
        df = df[df.status == "ok"].reset_index(drop=True)
    if not len(df):
        raise ValueError(f"sweep {out} has no finished cells")
    return df
