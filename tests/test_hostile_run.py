"""`workbench run` with hostile values: each refused with one line naming the flag (exit 2, no traceback)
before anything is packed or prefilled; Ctrl-C at start-up; a hook that raises; --verify never's risk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hostile_util import CLI_CTRL_C, REPO, assert_clean_error, cli
from workbench.cli import main
from workbench.config import VERIFY_NEVER_RISK
from workbench.engine.engine import Engine
from workbench.hooks import HookError, run_with_hooks
from workbench.store.pack import pack

REF = REPO / "data" / "models"


@pytest.fixture(scope="module")
def ref_store(tmp_path_factory):
    """The reference model packed (a real tokenizer: stdin text, token strings)."""
    return pack(REF / "ref-moe", tmp_path_factory.mktemp("ref") / "s", progress=False)


def _main_error(capsys, *argv):
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err, err
    return err[-1]


@pytest.mark.parametrize("flags, needle", [
    (["--temp", "nan"], "--temp must be a finite number, got nan"),
    (["--temp", "inf"], "--temp must be a finite number, got inf"),
    (["--top-p", "nan"], "--top-p must be a finite number"),
    (["--seed", "-1"], "--seed -1 is out of range: give a value in [0, 18446744073709551615]"),
    (["--seed", str(2**70)], f"--seed {2**70} is out of range"),
    (["--extra-eos-token", "<|x|>"], "--extra-eos-token '<|x|>' is not a token of this tokenizer"),
    (["--extra-eos-token", "999999"], "--extra-eos-token 999999 is outside the vocabulary [0, 4096)"),
    (["--extra-eos-token", "-1"], "--extra-eos-token -1 is outside the vocabulary [0, 4096)"),
    (["--num-draft-tokens", "0", "--draft-model", REF / "ref-draft"], "--num-draft-tokens 0 is out of range"),
])
def test_bad_run_values_are_refused_naming_the_flag(ref_store, capsys, flags, needle):
    line = _main_error(capsys, "run", ref_store, "-p", "def f(", "--max-tokens", 2, *flags)
    assert line.startswith("workbench: error: ") and needle in line, line


def test_a_real_extra_eos_token_stops_generation(ref_store, capsys):
    assert main(["run", str(ref_store), "-p", "def f(", "--max-tokens", "2", "--extra-eos-token", "!", "3"]) == 0


def test_bad_values_are_refused_before_packing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    line = _main_error(capsys, "run", "--model", REF / "ref-moe", "-p", "x", "--seed", "-1")
    assert "--seed -1" in line and not (tmp_path / "cache").exists()
    line = _main_error(capsys, "run", "--model", REF / "ref-moe", "-p", "x", "--trace", tmp_path)
    assert f"--trace {tmp_path} is a directory" in line and not (tmp_path / "cache").exists()


def test_argparse_errors_are_one_line():
    r = cli("run", "--model", "x", "--max-tokens", "x")
    assert_clean_error(r, "argument --max-tokens/-m: invalid int value: 'x'", "see workbench run --help")


def test_random_bytes_on_stdin(ref_store):
    r = subprocess.run([sys.executable, "-m", "workbench.cli", "run", str(ref_store), "-p", "-", "--max-tokens", "2"],
                       input=bytes(range(128, 256)) * 20, capture_output=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    r.stdout, r.stderr = r.stdout.decode(), r.stderr.decode()
    assert_clean_error(r, "--prompt -: stdin is not UTF-8 text", "--prompt-ids")


def test_a_prompt_longer_than_the_context_is_refused_before_prefill(ref_store, capsys, monkeypatch):
    from workbench.engine import engine

    monkeypatch.setattr(engine.Engine, "generate", lambda *a, **k: pytest.fail("prefill started"))
    line = _main_error(capsys, "run", ref_store, "--prompt-ids", ",".join(["5"] * 5000), "--max-tokens", 4)
    assert "the prompt is 5000 tokens; the model's context is 2048 (max_position_embeddings" in line


def test_a_long_stdin_prompt_is_refused_in_one_line(ref_store):
    r = subprocess.run([sys.executable, "-m", "workbench.cli", "run", str(ref_store), "-p", "-", "--max-tokens", "2"],
                       input="def f(x):\n" * 150000, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert_clean_error(r, "the prompt is 900000 tokens; the model's context is 2048")


def test_verify_never_shows_its_risk(tiny, capsys):
    _, store = tiny("qwen3_moe", 4)
    assert main(["run", str(store), "--prompt-ids", "1,2,3", "--max-tokens", "2", "--verify", "never"]) == 0
    assert VERIFY_NEVER_RISK in capsys.readouterr().out
    assert main(["run", str(store), "--prompt-ids", "1,2,3", "--max-tokens", "2"]) == 0
    assert VERIFY_NEVER_RISK not in capsys.readouterr().out


@pytest.mark.parametrize("delay", [0.3, 0.5, 0.7, 0.9, 1.2])
def test_ctrl_c_during_start_up_exits_130_without_a_traceback(tiny, delay):
    """Before the fix a Ctrl-C inside the imports printed a traceback, or was swallowed by a library and the
    run went on (a 100000-token run: the communicate timeout catches it)."""
    _, store = tiny("qwen3_moe", 4)
    p = subprocess.Popen([*CLI_CTRL_C, "run", str(store), "--prompt-ids", "1,2,3",
                          "--max-tokens", "100000"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    time.sleep(delay)  # inside the imports of build_parser (mlx, mlx-lm) or opening the store
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 130 and "Traceback" not in err, (p.returncode, err)


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_the_cli_keeps_the_callers_ctrl_c(inherited, capsys):
    """Where Ctrl-C raises KeyboardInterrupt, the start-up handler is put back to it; a caller that ignores
    Ctrl-C (a script's background job inherits SIGINT ignored) keeps it ignored, during the imports too
    (it was exit 130 during start-up, then ignored: the run went on after a Ctrl-C)."""
    from workbench.cli import _exit_at_start_up, main

    want = signal.default_int_handler if inherited == "default" else signal.SIG_IGN
    seen = []  # the SIGINT handlers main sets
    old = signal.signal(signal.SIGINT, want)
    try:
        real = signal.signal
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(signal, "signal", lambda sig, handler: (sig == signal.SIGINT and seen.append(handler),
                                                               real(sig, handler))[1])
            with pytest.raises(SystemExit):
                main(["--help"])
        assert signal.getsignal(signal.SIGINT) is want
        assert seen == ([_exit_at_start_up, signal.default_int_handler] if inherited == "default" else []), seen
    finally:
        signal.signal(signal.SIGINT, old)
    capsys.readouterr()


def test_a_hook_that_raises_in_cache_miss_names_itself_and_leaves_the_engine_usable(tiny):
    _, store = tiny("qwen3_moe", 4)

    def broken_hook(value, **ctx):
        raise ZeroDivisionError("boom")

    with Engine(store, arena="0.5", progress=False) as eng:
        ref = eng.generate([1, 2, 3], max_tokens=3).tokens
        with pytest.raises(HookError, match=r"hook .*broken_hook on cache.miss layer \d+ expert \d+ raised "
                                            r"ZeroDivisionError: boom; fix the hook or remove it") as e:
            run_with_hooks(eng, [1, 2, 3], [("cache.miss", broken_hook)], max_tokens=3)
        assert isinstance(e.value.__cause__, ZeroDivisionError)
        assert not any(eng.arena.pinned)
        assert eng.generate([1, 2, 3], max_tokens=3).tokens == ref
