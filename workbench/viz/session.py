"""Running the engine for a notebook: the model to open, the prompt to use, and a recorded
generation kept once per kernel. The measurements themselves are package functions; these only
wire them up."""

from __future__ import annotations

from .display import is_static

_RUNS: dict = {}


def model_path(model=None):
    """``model`` as a Path, or the shipped reference model (``workbench.data.default_model``)."""
    from pathlib import Path

    if model:
        p = Path(model).expanduser()
        if not p.exists():
            raise ValueError(f"model {p} does not exist; give an mlx-lm model directory or a workbench store, "
                             "or None for the shipped reference model")
        return p
    from workbench.data import default_model

    return default_model()


def default_prompt(engine=None, workload: str = "code_heldout", index: int = 0, n_ids: int = 16,
                   max_tokens: int = 24):
    """The first held-out workload prompt, as its last ``max_tokens`` token ids when the model has a
    tokenizer (so notebook runs cost the same whatever the prompt's length), else ``n_ids`` fixed ids."""
    text = None
    try:
        from workbench.data import workload as load_workload

        text = load_workload(workload)[index]["text"]
    except (ValueError, IndexError, KeyError, OSError):
        text = None
    if engine is not None and text is not None:
        try:
            ids = list(engine.tokenizer.encode(text))
        except Exception:  # the store ships no tokenizer
            ids = []
        if ids:
            return ids[-max_tokens:]  # the prompt's end: where generation continues
    vocab = int((engine.config.get("vocab_size") if engine is not None else 0) or 128)
    return [(7 * i + 3) % vocab for i in range(1, n_ids + 1)]


class Run:
    """One recorded generation: ``result`` (engine Result), ``trace`` (Trace), ``path``, ``model``."""

    def __init__(self, result, trace, path, model):
        self.result, self.trace, self.path, self.model = result, trace, path, model

    @property
    def stats(self) -> dict:
        return self.result.stats


def record(model=None, prompt=None, max_tokens: int = 32, arena="1.0", moe_input: bool = False,
           io_events: bool = False, progress: bool | None = None, **engine_kw) -> Run:
    """Generate once with a trace recorder (cached per kernel for the same arguments). ``arena``
    and ``engine_kw`` (``io=``, ``ahead=``, ``decode=``...) are the Engine's (workbench.config).

    ``progress`` (default: on in live notebooks, off in static report runs) shows tqdm bars.
    """
    if progress is None:
        progress = not is_static()
    import tempfile
    from pathlib import Path

    from workbench.engine.engine import Engine
    from workbench.trace.recorder import TraceRecorder
    from workbench.trace.schema import read_trace

    mp = model_path(model)
    key = (str(mp), repr(prompt), max_tokens, repr(arena), moe_input, io_events, repr(sorted(engine_kw.items())))
    if key in _RUNS:
        return _RUNS[key]
    path = Path(tempfile.mkdtemp(prefix="wb-trace-")) / "run.parquet"
    with Engine.open(mp, arena=arena, progress=progress, **engine_kw) as eng:
        ids = prompt if prompt is not None else default_prompt(eng)
        res = eng.generate(ids, max_tokens=max_tokens, trace=TraceRecorder(path, moe_input=moe_input,
                                                                          io_events=io_events))
    run = _RUNS[key] = Run(res, read_trace(path), path, mp)
    return run


