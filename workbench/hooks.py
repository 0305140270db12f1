"""Named hook points (TransformerLens style).

Names: ``layer.{i}.moe.input``, ``layer.{i}.router.logits``, ``layer.{i}.experts.selected``,
``cache.hit``, ``cache.miss``, ``cache.evict``, ``io.submit``, ``io.done``, ``io.cancel``,
``prefetch.outcome``, ``token.end``. A hook function is called ``fn(value, **ctx)``; if it
returns something other than None, that replaces the value (meaningful for arrays such as
router logits). With no subscriber the engine skips the call entirely (``hooks.active``).
Forward points (``layer.{i}.moe.input``, ``layer.{i}.router.logits``) carry ``step`` and
``attempt`` (a layer recomputed by optimistic decode fires again with a higher attempt); the
others fire once per verified value. A hook that raises ends the run with a ``HookError`` naming
the hook, the point and the error (the engine stays usable; the original is its ``__cause__``).
A hook added ``host_only`` makes no MLX call (it may keep references to the values it is given):
where every hook is, the handshake keeps answering from its server thread (``engine/server.py``).
"""

from __future__ import annotations

import fnmatch
from contextlib import contextmanager


class HookError(RuntimeError):
    """A subscriber raised; the message names it, the hook point and the error."""


class Hooks:
    """Subscribers by exact name or glob pattern; ``fire`` is cheap when nothing matches."""

    def __init__(self):
        self._exact: dict[str, list] = {}
        self._patterns: list[tuple[str, object]] = []
        self._resolved: dict[str, list] = {}
        self._host_only: set = set()  # (name, fn) added host_only
        self.active = False
        self.host_only = True  # every subscriber was added host_only (or there is none)

    def add(self, name: str, fn, host_only: bool = False) -> None:
        if host_only:
            self._host_only.add((name, fn))
        if any(c in name for c in "*?["):
            self._patterns.append((name, fn))
        else:
            self._exact.setdefault(name, []).append(fn)
        self._changed()

    def remove(self, name: str, fn) -> None:
        if (name, fn) in self._patterns:
            self._patterns.remove((name, fn))
        elif fn in self._exact.get(name, []):
            self._exact[name].remove(fn)
        if not self.subscribed(name, fn):
            self._host_only.discard((name, fn))
        self._changed()

    def clear(self) -> None:
        self._exact.clear()
        self._patterns.clear()
        self._host_only.clear()
        self._changed()

    def subscribed(self, name: str, fn) -> bool:
        return (name, fn) in self._patterns or fn in self._exact.get(name, ())

    def _changed(self):
        self._resolved = {}
        pairs = self._patterns + [(n, f) for n, fns in self._exact.items() for f in fns]
        self.active = bool(pairs)
        self.host_only = all(p in self._host_only for p in pairs)

    def subscribers(self, name: str) -> list:
        subs = self._resolved.get(name)
        if subs is None:
            subs = list(self._exact.get(name, ())) + [f for p, f in self._patterns if fnmatch.fnmatchcase(name, p)]
            self._resolved[name] = subs
        return subs

    def fire(self, name: str, value=None, **ctx):
        for fn in self.subscribers(name):
            try:
                out = fn(value, name=name, **ctx)
            except HookError:
                raise
            except Exception as e:
                where = "".join(f" {k} {ctx[k]}" for k in ("layer", "expert", "step") if ctx.get(k) is not None)
                raise HookError(f"hook {getattr(fn, '__qualname__', fn)!s} on {name}{where} raised "
                                f"{type(e).__name__}: {e}; fix the hook or remove it (engine.hooks.remove)") from e
            if out is not None:
                value = out
        return value

    @contextmanager
    def using(self, pairs):
        """Temporarily add ``[(name_or_pattern, fn), ...]``."""
        for name, fn in pairs:
            self.add(name, fn)
        try:
            yield self
        finally:
            for name, fn in pairs:
                self.remove(name, fn)


def run_with_hooks(engine, prompt, fwd_hooks, **generate_kw):
    """Generate with ``fwd_hooks = [(name_or_pattern, fn), ...]`` active for this call only."""
    with engine.hooks.using(fwd_hooks):
        return engine.generate(prompt, **generate_kw)


def run_with_cache(engine, prompt, names_filter=None, **generate_kw):
    """Generate and return ``(result, cache)``; cache maps hook name -> list of values in order,
    one per step for the ``layer.*`` points (the final, verified value where optimistic decode
    recomputed a layer).

    ``names_filter``: None (every hook point), a glob string, a list of names/globs, or a
    callable ``name -> bool``.
    """
    cache: dict[str, list] = {}
    if names_filter is None:
        patterns, pred = ["*"], None
    elif callable(names_filter):
        patterns, pred = ["*"], names_filter
    elif isinstance(names_filter, str):
        patterns, pred = [names_filter], None
    else:
        patterns, pred = list(names_filter), None

    where: dict[tuple, int] = {}

    def keep(value, name, **ctx):
        if pred is None or pred(name):
            item = value if ctx == {} or value is not None else ctx
            values = cache.setdefault(name, [])
            if name.startswith("layer.") and "step" in ctx:  # one value per (layer point, step): a layer
                at = where.get((name, ctx["step"]))        # recomputed after a miss replaces its first try
                if at is not None:
                    values[at] = item
                    return
                where[(name, ctx["step"])] = len(values)
            values.append(item)

    with engine.hooks.using([(p, keep) for p in patterns]):
        result = engine.generate(prompt, **generate_kw)
    return result, cache
