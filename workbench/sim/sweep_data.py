"""A sweep's results: one Parquet dataset of part files, each holding the rows of one batch of cells.

    OUT/part-<batch>.parquet   rows: configuration, counters, timing; status ok | failed (+ error)

A row is trusted only when ``cell_id`` is the hash of its own ``config_json`` (the cell's whole
configuration: trace content hash, workbench version, every setting), so a damaged, truncated or
hand-edited file is never taken for a finished cell. ``OUT`` is a local folder or an fsspec URL.
"""

from __future__ import annotations

import hashlib
import json
import uuid

import pandas as pd

PART_GLOB = "part-*.parquet"
ID_COLUMNS = ("cell_id", "config_json", "status")


def config_hash(config: dict) -> tuple[str, str]:
    """(cell id, canonical JSON) of a cell's configuration."""
    text = json.dumps(config, sort_keys=True, default=str)
    return cell_id(text), text


def cell_id(config_json: str) -> str:
    """The id of a cell whose canonical configuration JSON is ``config_json``."""
    return hashlib.sha256(config_json.encode()).hexdigest()[:16]


def is_url(path) -> bool:
    return "://" in str(path)


def out_fs(out):
    """(fsspec filesystem, root path) of a sweep folder (local path or URL)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(str(out))
    return fs, root.rstrip("/")


def check_out(out) -> None:
    """``--out`` is a folder that can be written (not a file); ValueError naming it otherwise."""
    if is_url(out):
        fs, root = out_fs(out)
        if fs.isfile(root):
            raise ValueError(f"--out {out} is a file, not a folder; give a folder for the sweep's dataset")
        return
    from ..checks import output_dir

    output_dir("--out", out)


def encode_part(rows: list[dict]) -> bytes:
    """Rows as the bytes of one Parquet part file (the client encodes the rows of the batches that ended)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = dict.fromkeys(k for row in rows for k in row)  # every row's keys (a failed row has fewer)
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pydict({k: [row.get(k) for row in rows] for k in columns}), sink)
    return sink.getvalue().to_pybytes()


def write_part(out, data: bytes) -> str:
    """Write Parquet bytes (``encode_part``) as a new part file (atomic: temp name, then rename;
    an object store puts it whole)."""
    fs, root = out_fs(out)
    fs.makedirs(root, exist_ok=True)
    name = f"part-{uuid.uuid4().hex[:16]}.parquet"
    if is_url(out) and not str(out).startswith("file://"):
        with fs.open(f"{root}/{name}", "wb") as f:
            f.write(data)
    else:
        from pathlib import Path

        from ..fsutil import atomic_write

        atomic_write(f"{root}/{name}", lambda tmp: Path(tmp).write_bytes(data))
    return f"{root}/{name}"


def _read_part(fs, path) -> pd.DataFrame:
    """A part file's verified rows; ValueError naming the file when it is unreadable or a row does not verify."""
    import pyarrow.parquet as pq

    try:
        with fs.open(path, "rb") as f:
            df = pq.read_table(f).to_pandas()
    except Exception as e:  # pyarrow raises several types for bad files
        raise ValueError(f"sweep part {path} is not readable Parquet ({type(e).__name__}); move it away and rerun the sweep") from None
    missing = [c for c in ID_COLUMNS if c not in df.columns]
    if missing or not len(df):
        raise ValueError(f"sweep part {path} is malformed (missing {missing}, {len(df)} rows); move it away and rerun the sweep")
    ok = [cell_id(c) == i for i, c in zip(df.cell_id, df.config_json)]
    if not all(ok):
        raise ValueError(f"sweep part {path}: {ok.count(False)} rows do not match their cell id (edited or damaged); "
                         "move it away and rerun the sweep")
    return df


def read_parts(out, on_bad=None) -> pd.DataFrame:
    """Every verified row of ``out`` (all statuses). ``on_bad(fs, path, message)``: called for
    a bad part instead of raising (the sweep uses it to set the part aside and rerun its cells)."""
    fs, root = out_fs(out)
    if not fs.isdir(root):
        return pd.DataFrame(columns=list(ID_COLUMNS))
    frames = []
    for p in sorted(fs.glob(f"{root}/{PART_GLOB}")):
        try:
            frames.append(_read_part(fs, p))
        except ValueError as e:
            if on_bad is None:
                raise
            on_bad(fs, p, str(e))
    if not frames:
        return pd.DataFrame(columns=list(ID_COLUMNS))
    return pd.concat(frames, ignore_index=True)


def finished(df: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: its latest ok row (by ``finished_at``), else its latest failed row."""
    if not len(df):
        return df
    at = df["finished_at"] if "finished_at" in df.columns else pd.Series(0.0, index=df.index)
    df = df.assign(_ok=df.status == "ok", _at=at.fillna(0.0), _n=range(len(df)))
    df = df.sort_values(["_ok", "_at", "_n"]).drop_duplicates("cell_id", keep="last").sort_values("_n")
    return df.drop(columns=["_ok", "_at", "_n"]).reset_index(drop=True)


def set_aside(fs, path, message) -> str:
    """Rename a bad part to ``NAME.bad`` (kept for the user, no longer read); returns the note to print."""
    fs.mv(path, path + ".bad")
    return f"{message.split(';')[0]}; set aside as {path}.bad, its cells rerun"
