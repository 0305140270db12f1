"""Every quantitative axis names its unit: its title ends in "(UNIT)".

``UNITS`` are the units the charts use. A quantity without one says plainly what it is, with
one of ``PLAIN``: ``(count)`` for a number of things, ``(ratio)`` for one quantity over a like
one (speedups, ours / seed), ``(share)`` for a fraction of a whole drawn from 0 to 1, and
``(unitless)`` for the rest (a cosine). Text after ``;`` inside the brackets is a note:
"ours / seed (ratio; bar: 95% interval)".

``axes_without_unit(spec)`` lists the quantitative x / y axes of a Vega-Lite spec that break the
rule; the tests run it on every chart builder and on every chart the notebooks draw.
"""

from __future__ import annotations

import re

UNITS = {"%", "GB", "MB", "bytes", "GB/s", "MB/token", "bytes/token", "s", "ms", "s/token", "ms/token",
         "tokens/s", "nats", "x plain decode"}
PLAIN = {"count", "ratio", "share", "unitless"}


def axis_unit(title) -> str | None:
    """The unit a title ends with ("hit rate (%)" -> "%"), or None when it names none we know."""
    if isinstance(title, list):
        title = " ".join(str(t) for t in title)
    m = re.search(r"\(([^()]*)\)\s*$", str(title or ""))
    if not m:
        return None
    unit = m.group(1).split(";")[0].strip()
    return unit if unit in UNITS | PLAIN else None


def _views(node, path="spec"):
    """(path, [unit specs sharing one set of axes]) for every view of a spec."""
    if not isinstance(node, dict):
        return
    if "layer" in node:
        leaves = []

        def collect(n):
            if "layer" in n:
                for sub in n["layer"]:
                    collect(sub)
            elif "mark" in n:
                leaves.append(n)

        collect(node)
        yield path, leaves
    elif "mark" in node:
        yield path, [node]
    for key in ("hconcat", "vconcat", "concat"):
        for i, sub in enumerate(node.get(key) or []):
            yield from _views(sub, f"{path}.{key}[{i}]")
    if isinstance(node.get("spec"), dict):  # facet / repeat
        yield from _views(node["spec"], f"{path}.spec")


def axes_without_unit(spec: dict) -> list[str]:
    """'path x: title' for each quantitative axis whose title names no unit (empty list: all good).

    In a layered view the layers share an axis: one of them must title it with a unit and no
    other may give it a title without one."""
    bad = []
    for path, leaves in _views(spec):
        for channel in ("x", "y"):
            encs = [leaf.get("encoding", {}).get(channel) for leaf in leaves]
            encs = [e for e in encs if isinstance(e, dict)]
            if not any(e.get("type") == "quantitative" for e in encs):
                continue
            if all("axis" in e and e["axis"] is None for e in encs):
                continue  # no axis drawn
            titles = [e.get("title") or (e.get("axis") or {}).get("title") for e in encs]
            titles = [t for t in titles if t]
            wrong = [t for t in titles if axis_unit(t) is None]
            if not titles or wrong:
                fields = sorted({str(e.get("field")) for e in encs if e.get("field")})
                bad.append(f"{path} {channel}: {wrong[0] if wrong else 'no title'!r} (field {', '.join(fields)})")
    return bad


def _explicit_titles(node, found=None) -> set:
    """Every axis title a chart's author wrote (an encoding's ``title`` or its axis's)."""
    found = set() if found is None else found
    if isinstance(node, dict):
        for key in ("title",):
            if isinstance(node.get(key), str) and ("field" in node or "aggregate" in node):
                found.add(node[key])
        axis = node.get("axis")
        if isinstance(axis, dict) and isinstance(axis.get("title"), str):
            found.add(axis["title"])
        for value in node.values():
            _explicit_titles(value, found)
    elif isinstance(node, list):
        for value in node:
            _explicit_titles(value, found)
    return found


def _axis_titles(node):
    """The titles of every axis in a compiled Vega spec."""
    if isinstance(node, dict):
        for axis in node.get("axes") or []:
            if isinstance(axis, dict) and axis.get("title") is not None:
                yield axis["title"]
        for value in node.values():
            yield from _axis_titles(value)
    elif isinstance(node, list):
        for value in node:
            yield from _axis_titles(value)


def field_titled_axes(spec: dict) -> list[str]:
    """Quantitative or not, every axis as Vega-Lite draws it (compiled to Vega) must carry a title the
    chart wrote: never a field name, and never a field name joined to one (a layer that encodes
    ``low`` without a title turns "hit rate (%)" into "low, hit rate (%)")."""
    import json

    import vl_convert as vlc

    from .render import vl_version

    written = _explicit_titles(spec)
    vega = vlc.vegalite_to_vega(json.dumps(spec), vl_version=vl_version())
    vega = json.loads(vega) if isinstance(vega, str) else vega
    titles = [" ".join(t) if isinstance(t, list) else str(t) for t in _axis_titles(vega)]
    return [t for t in titles if t not in written]
