"""mlx-lm's generation interface on the streaming engine: sampling, EOS, prompts, chat templates,
model resolution, and what ``workbench run`` prints."""

import importlib
import io
import json
import shutil

import mlx.core as mx
import pytest

import numpy as np

from conftest import DEVICE, TOL, resident_greedy
from workbench import generate as gen
from workbench.cli import main
from workbench.data import REFERENCE
from workbench.engine.engine import Engine, reseed
from workbench.model import ModelError

PROMPT = [5, 17, 3, 99, 42, 8, 77, 1, 64, 23, 11, 90, 31, 7, 56, 2, 88, 14, 70, 45]
SAMPLING = [dict(temp=3.0), dict(temp=3.0, top_p=0.9999, top_k=20), dict(temp=4.0, min_p=1e-4)]
needs_reference = pytest.mark.skipif(not (REFERENCE / "config.json").exists(), reason="reference model not shipped")


def recording(sampler, draws):
    """``sampler``, recording each draw's key (taken before it) and log-probs in ``draws``, unevaluated
    (read after the run: the engine may call the sampler while the device waits for the host)."""
    def sample(logprobs):
        draws.append((mx.random.state[0], logprobs))
        return sampler(logprobs)
    return sample


def resident_sampled(model_dir, prompt, max_tokens, seed, draws=None, **sampling):
    """mlx-lm's own generate_step with its own sampler, seeded right before generation."""
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model

    model, _ = load_model(model_dir)
    mx.random.seed(seed)
    sampler = gen.make_sampler(**sampling)
    steps = generate_step(mx.array(prompt), model, max_tokens=max_tokens,
                          sampler=sampler if draws is None else recording(sampler, draws))
    return [int(t) for (t, _), _ in zip(steps, range(max_tokens))]


def assert_same_stream(got, got_draws, want, want_draws, sampler, what):
    """Sampled tokens equal resident mlx-lm's. On the GPU, where log-probs agree within TOL only, the
    streams may part at a near-tie: the same keys up to there (one draw per token; a token drawn again
    after a give-up repeats its key), log-probs within TOL, and the sampler with that key picks each
    side's token from each side's log-probs: the difference is the kernels', not the engine's."""
    if got == want:
        return
    assert DEVICE == "gpu", what
    i = next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)
    keys = [np.array(k).tolist() for k, _ in got_draws]
    mine = [j for j in range(len(keys)) if j + 1 == len(keys) or keys[j + 1] != keys[j]]  # the last draw of a key
    assert [keys[j] for j in mine[:i + 1]] == [np.array(k).tolist() for k, _ in want_draws[:i + 1]], what
    lp, ref_lp = got_draws[mine[i]][1], want_draws[i][1]
    np.testing.assert_allclose(np.array(lp), np.array(ref_lp), atol=TOL, err_msg=what)
    for logprobs, token in ((lp, got[i]), (ref_lp, want[i])):
        reseed(want_draws[i][0])
        assert int(sampler(logprobs).item()) == token, what


@pytest.mark.parametrize("bits", [None, 4])
@pytest.mark.parametrize("sampling", SAMPLING)
def test_sampled_stream_equals_resident(tiny, bits, sampling):
    model_dir, store = tiny("qwen3_moe", bits)
    greedy, _ = resident_greedy(model_dir, PROMPT, 16)
    ref_draws = []
    ref = resident_sampled(model_dir, PROMPT, 16, seed=11, draws=ref_draws, **sampling)
    assert ref != greedy, "the sampler must change the tokens for the test to mean anything"
    for arena, decode in (("2", "auto"), ("0.25", "auto"), ("0.25", "optimistic"), ("0.25", "layer"), ("1.0", "auto")):
        draws = []
        with Engine(store, arena=arena, decode=decode, progress=False) as eng:
            mx.random.seed(11)
            res = eng.generate(PROMPT, max_tokens=16, sampler=recording(gen.make_sampler(**sampling), draws))
        what = f"bits={bits} arena={arena} decode={decode} {sampling}"
        assert_same_stream(res.tokens, draws, ref, ref_draws, gen.make_sampler(**sampling), what)
        st = res.stats
        if arena == "1.0":  # sampled takes greedy's paths: every token optimistic, none recomputed
            assert st["optimistic_tokens"] == 16 and st["recomputes"] == 0 and st["misses"] == 0, what
        else:
            assert st["misses"] > 0, what
        if decode == "optimistic":  # misses recompute, and a recomputed token is drawn again with its key
            assert st["optimistic_tokens"] == 16 and st["recomputes"] > 0, what


def test_reseed_draws_again_with_the_same_key():
    """A sampled token the device gave up is drawn again with its first draw's key (``reseed``)."""
    mx.random.seed(5)
    mx.random.categorical(mx.zeros((64,)))
    key = mx.random.state[0]
    first = [mx.random.categorical(mx.zeros((64,))).item() for _ in range(4)]
    reseed(key)
    assert [mx.random.categorical(mx.zeros((64,))).item() for _ in range(4)] == first


def test_other_seed_other_tokens(tiny):
    _, store = tiny("qwen3_moe", 4)
    with Engine(store, arena="0.25", progress=False) as eng:
        runs = []
        for seed in (1, 1, 2):
            mx.random.seed(seed)
            runs.append(eng.generate(PROMPT, max_tokens=16, sampler=gen.make_sampler(temp=3.0)).tokens)
    assert runs[0] == runs[1] != runs[2]


def test_stops_at_eos_and_keeps_the_stop_token(tiny):
    model_dir, store = tiny("qwen3_moe", 4)
    greedy, _ = resident_greedy(model_dir, PROMPT, 12)
    stop = greedy[5]
    first = greedy.index(stop)
    with Engine(store, arena="0.25", progress=False) as eng:
        res = eng.generate(PROMPT, max_tokens=12, eos_token_ids=[stop])
        plain = eng.generate(PROMPT, max_tokens=12)
    assert res.tokens == greedy[:first + 1]
    assert plain.tokens == greedy


def test_cli_extra_eos_token_and_json_config(tiny, capsys):
    model_dir, store = tiny("qwen3_moe", 4)
    greedy, _ = resident_greedy(model_dir, PROMPT, 12)
    stop = greedy[4]
    capsys.readouterr()
    assert main(["run", "--model", str(store), "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens", "12",
                 "--arena", "3", "--extra-eos-token", str(stop), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == greedy[:greedy.index(stop) + 1]
    assert out["finish_reason"] == "stop"
    cfg = out["config"]
    assert cfg["arena"]["slots"] == 3 and cfg["arena"]["bytes"] == 3 * cfg["arena"]["expert_bytes"] > 0
    assert cfg["policy"] == "lru" and cfg["predictor"] == "none" and cfg["prompt_tokens"] == len(PROMPT)
    assert cfg["model"] == str(store)
    assert set(cfg["versions"]) == {"workbench", "mlx", "mlx-lm"} and all(cfg["versions"].values())
    assert out["stats"]["peak_memory_gb"] > 0 and out["timing"]["generation_tokens"] == len(out["tokens"])
    assert isinstance(out["stats"]["page_cache_hits"], int)


def test_cli_positional_and_flag_model_agree(tiny, capsys):
    _, store = tiny("qwen3_moe", 4)
    outs = []
    for argv in (["run", str(store)], ["run", "--model", str(store)], ["run", str(store), "--model", str(store)]):
        capsys.readouterr()
        assert main(argv + ["--prompt-ids", "1,2,3", "--max-tokens", "4", "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out)["tokens"])
    assert outs[0] == outs[1] == outs[2]
    assert main(["run", str(store), "--model", str(store) + "x", "--prompt-ids", "1,2", "--max-tokens", "2"]) == 2
    assert "two models" in capsys.readouterr().err


def test_page_cache_hits_are_na_when_reads_bypass_it(tiny, capsys):
    from workbench.store.reader import available_modes

    if "direct" not in available_modes() and "nocache" not in available_modes():
        pytest.skip("no read mode that bypasses the page cache here")
    mode = "direct" if "direct" in available_modes() else "nocache"
    _, store = tiny("qwen3_moe", 4)
    capsys.readouterr()
    rc = main(["run", str(store), "--prompt-ids", "1,2,3", "--max-tokens", "4", "--io-mode", mode, "--json"])
    if rc != 0:
        pytest.skip(f"--io-mode {mode} is not supported by this file system")
    out = json.loads(capsys.readouterr().out)
    assert out["stats"]["page_cache_hits"] is None and out["config"]["io_mode"] == mode
    assert main(["run", str(store), "--prompt-ids", "1,2,3", "--max-tokens", "4", "--io-mode", mode]) == 0
    assert "n/a (reads bypass the page cache)" in capsys.readouterr().out


@needs_reference
def test_prompt_dash_reads_stdin(monkeypatch, capsys):
    text = "def add(a, b):\n    return"
    outs = []
    for prompt, stdin in ((text, ""), ("-", text)):
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        capsys.readouterr()
        assert main(["run", str(REFERENCE), "-p", prompt, "--max-tokens", "6", "--arena", "0.25", "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0]["tokens"] == outs[1]["tokens"]
    with Engine.open(REFERENCE, progress=False) as eng:
        assert outs[1]["config"]["prompt_tokens"] == len(eng.tokenizer.encode(text)) > 3
    assert outs[1]["config"]["chat_template"] is False  # the reference tokenizer has none


@needs_reference
def test_summary_line_as_mlx_lm_prints_it(capsys):
    assert main(["run", str(REFERENCE), "-p", "import os\\n", "--max-tokens", "5", "--arena", "0.25"]) == 0
    out = capsys.readouterr().out
    for line in ("Prompt: ", "Generation: 5 tokens, ", "Peak memory: "):
        assert line in out
    assert out.index("Generation: ") < out.index("expert lookups")  # mlx-lm's lines above our counters
    assert "tokens/s" not in out.split("Peak memory: ")[1]  # one tokens/s figure: mlx-lm's


TEMPLATE = ("{% if note %}<<note>>{{ note }}\n{% endif %}{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}\n"
            "{% endfor %}{% if add_generation_prompt %}<<assistant>>{% endif %}")  # note: a --chat-template-config key


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny random model whose tokenizer (the reference one) has a chat template."""
    from workbench.randmodel import make_random_model
    from workbench.store.pack import pack

    if not (REFERENCE / "tokenizer.json").exists():
        pytest.skip("reference tokenizer not shipped")
    root = tmp_path_factory.mktemp("chat")
    model = make_random_model(root / "model", "qwen3_moe", seed=3, moving=True, layers=2, experts=8, top_k=2,
                              hidden=64, expert_width=32, vocab=4096)
    shutil.copy(REFERENCE / "tokenizer.json", model / "tokenizer.json")
    config = json.loads((REFERENCE / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return model, pack(model, root / "store", progress=False)


def test_chat_template_builds_the_prompt(chat_model):
    from mlx_lm.utils import load_tokenizer

    tok = load_tokenizer(chat_model[1])
    assert tok.has_chat_template
    ids = gen.build_prompt(tok, "hello", system_prompt="be brief")
    assert tok.decode(ids) == "<<system>>be brief\n<<user>>hello\n<<assistant>>"
    assert tok.decode(gen.build_prompt(tok, "hello")) == "<<user>>hello\n<<assistant>>"
    assert gen.build_prompt(tok, "hello", "be brief", ignore_chat_template=True) == tok.encode("hello")


def test_cli_run_applies_the_chat_template(chat_model, capsys):
    from mlx_lm.utils import load_tokenizer

    model, store = chat_model
    tok = load_tokenizer(store)
    ids = gen.build_prompt(tok, "hello", system_prompt="be brief")
    ref, _ = resident_greedy(model, ids, 6)
    capsys.readouterr()
    assert main(["run", str(store), "-p", "hello", "--system-prompt", "be brief", "--max-tokens", "6",
                 "--arena", "0.25", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["chat_template"] is True and out["config"]["prompt_tokens"] == len(ids)
    assert out["tokens"] == ref
    assert main(["run", str(store), "-p", "hello", "--ignore-chat-template", "--max-tokens", "2", "--json"]) == 0
    raw = json.loads(capsys.readouterr().out)
    assert raw["config"]["chat_template"] is False and raw["config"]["prompt_tokens"] == len(tok.encode("hello"))


def test_cli_run_passes_the_chat_template_config(chat_model, capsys):
    """``--chat-template-config`` reaches the template (as mlx_lm generate passes it); one that is not a
    JSON object is refused before anything runs (exit 2, one line naming the flag)."""
    from mlx_lm.utils import load_tokenizer

    _, store = chat_model
    ids = gen.build_prompt(load_tokenizer(store), "hello", template_kwargs={"note": "brief"})
    assert main(["run", str(store), "-p", "hello", "--chat-template-config", '{"note": "brief"}', "--max-tokens", "2",
                 "--arena", "0.25", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["prompt_tokens"] == len(ids)
    assert main(["run", str(store), "-p", "hello", "--chat-template-config", "[1]", "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "--chat-template-config wants a JSON object" in err and "Traceback" not in err


def fake_hf_cache(root, repo, model_dir):
    """The Hugging Face hub cache layout: models--org--name/{refs/main, snapshots/<commit>/...}."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(commit)
    shutil.copytree(model_dir, repo_dir / "snapshots" / commit)
    return repo_dir / "snapshots" / commit


def test_hf_repo_id_resolves_from_the_local_cache(tiny, tmp_path, monkeypatch, capsys):
    model_dir, _ = tiny("qwen3_moe", 4)
    snapshot = fake_hf_cache(tmp_path / "hub", "someorg/tiny-moe", model_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "wb"))
    assert gen.resolve_model("someorg/tiny-moe") == snapshot
    capsys.readouterr()
    assert main(["run", "--model", "someorg/tiny-moe", "--prompt-ids", "1,2,3", "--max-tokens", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["model"] == "someorg/tiny-moe" and len(out["tokens"]) == 3


def test_missing_hf_repo_is_one_clear_error_without_download(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    def no_network(*a, **k):
        raise AssertionError("tried to download")

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.file_download, "get_hf_file_metadata", no_network)
    with pytest.raises(ModelError, match="not in the Hugging Face cache.*never downloads"):
        gen.resolve_model("someorg/absent-model")
    assert main(["run", "--model", "someorg/absent-model", "-p", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "huggingface-cli download someorg/absent-model" in err
    with pytest.raises(ModelError, match="does not exist"):
        gen.resolve_model(str(tmp_path / "nowhere"))


def test_bad_sampling_values_are_refused(capsys):
    assert main(["run", "x", "-p", "hi", "--temp", "-1"]) == 2
    assert "--temp -1.0 is out of range: give a value >= 0" in capsys.readouterr().err


def test_read_prompt_expands_escapes_as_mlx_lm(monkeypatch):
    assert gen.read_prompt("a\\nb\\tc") == "a\nb\tc"
    monkeypatch.setattr("sys.stdin", io.StringIO("from stdin\\n"))
    assert gen.read_prompt("-") == "from stdin\\n"  # stdin is taken as it is


@needs_reference
@pytest.mark.parametrize("draft", [False, True])
def test_cli_seed_matches_mlx_lm_generate(draft, capsys, monkeypatch):
    """`workbench run --seed S --temp T` prints what `mlx_lm generate --seed S --temp T` prints:
    both seed before the models are built, and building them draws from the same generator."""
    import sys

    from mlx_lm.generate import main as mlx_lm_main

    argv = ["-p", "def fib(n):\\n", "--max-tokens", "24", "--temp", "1.0", "--seed", "3"]
    if draft:
        argv += ["--draft-model", str(REFERENCE.parent / "ref-draft"), "--num-draft-tokens", "2"]
    monkeypatch.setattr(sys, "argv", ["mlx_lm.generate", "--model", str(REFERENCE), "--verbose", "F"] + argv)
    capsys.readouterr()
    mlx_lm_main()
    expected = capsys.readouterr().out
    assert main(["run", "--model", str(REFERENCE), "--arena", "0.25", "--json"] + argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"] + "\n" == expected and len(out["tokens"]) > 10
    greedy = main(["run", "--model", str(REFERENCE), "--arena", "0.25", "--json"] + argv[:4])
    assert greedy == 0 and json.loads(capsys.readouterr().out)["text"] != out["text"]  # sampling mattered


@needs_reference
def test_demo_makes_its_case(capsys, tmp_path):
    """The README's first command, without its report: the streamed text, resident mlx-lm's tokens
    equal to it, the arena table (every run equal to mlx-lm) and its chart."""
    out = tmp_path / "demo"
    assert main(["demo", "--no-report", "--max-tokens", "6", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "equal to the streamed ones" in text and "Generation: 6 tokens" in text
    rows = [line.split() for line in text.splitlines() if line.strip().startswith(("100%", "25%", "10%"))]
    assert len(rows) == 6 and all(r[-1] == "yes" for r in rows)
    assert (tmp_path / "demo_arenas.svg").read_text().startswith("<svg")


@needs_reference
def test_demo_prompt_is_whole_lines_and_does_not_loop():
    from workbench.demo import demo_prompt

    prompt = demo_prompt()
    assert prompt.endswith("\n")
    with Engine.open(REFERENCE, arena="100%", progress=False) as eng:
        res = eng.generate(prompt, max_tokens=48)
    assert len(set(res.tokens)) >= 24 and not res.text.startswith(prompt.splitlines()[-1])


def test_defaults_and_dash_m_are_mlx_lm_generates(capsys):
    """`-m` is --max-tokens (mlx-lm 0.32), default 100; the default prompt is mlx-lm's; a model path
    given to -m is refused with a hint naming --model."""
    mlx_gen = importlib.import_module("mlx_lm.generate")  # the module (mlx_lm.generate is also a function)

    from workbench.cli import build_parser

    assert (gen.DEFAULT_PROMPT, gen.DEFAULT_MAX_TOKENS) == (mlx_gen.DEFAULT_PROMPT, mlx_gen.DEFAULT_MAX_TOKENS)
    mine = build_parser().parse_args(["run", "x"])
    theirs = mlx_gen.setup_arg_parser().parse_args([])
    for flag in ("max_tokens", "temp", "top_p", "min_p", "top_k", "seed", "num_draft_tokens", "verbose",
                 "chat_template_config", "system_prompt"):
        assert getattr(mine, flag) == getattr(theirs, flag), flag
    assert build_parser().parse_args(["run", "x", "-m", "7"]).max_tokens == 7
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["run", "-m", "data/models/ref-moe", "-p", "x"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "-m is --max-tokens" in err and "--model data/models/ref-moe" in err


def _mlx_lm_generate(monkeypatch, capsys, argv) -> str:
    import sys

    from mlx_lm.generate import main as mlx_lm_main

    monkeypatch.setattr(sys, "argv", ["mlx_lm.generate", "--model", str(REFERENCE)] + argv)
    capsys.readouterr()
    mlx_lm_main()
    return capsys.readouterr().out


def _text_block(out: str) -> str:
    """What mlx_lm generate's verbose output shows between its two ``==========`` lines."""
    return out.split("=" * 10 + "\n", 1)[1].split("\n" + "=" * 10, 1)[0]


@needs_reference
@pytest.mark.parametrize("draft", [False, True])
def test_streamed_text_and_summary_as_mlx_lm_generate(draft, capsys, monkeypatch):
    """`workbench run` prints what `mlx_lm generate` prints: the text between two rules (streamed),
    then Prompt / Generation / Peak memory; our counters come after."""
    argv = ["-p", "def parse_config(path):", "-m", "24"]
    if draft:
        argv += ["--draft-model", str(REFERENCE.parent / "ref-draft"), "--num-draft-tokens", "2"]
    expected = _mlx_lm_generate(monkeypatch, capsys, argv)
    assert main(["run", str(REFERENCE), "--arena", "0.25"] + argv) == 0
    out = capsys.readouterr().out
    assert _text_block(out) == _text_block(expected) and len(_text_block(out)) > 20
    ours = [line.split(",")[0] for line in out.splitlines() if line.startswith(("Prompt:", "Generation:", "Peak memory"))]
    theirs = [line.split(",")[0] for line in expected.splitlines() if line.startswith(("Prompt:", "Generation:", "Peak"))]
    assert ours[:2] == theirs[:2] and len(ours) == 3
    assert main(["run", str(REFERENCE), "--arena", "0.25", "--verbose", "F"] + argv) == 0
    assert capsys.readouterr().out == _mlx_lm_generate(monkeypatch, capsys, argv + ["--verbose", "F"])


@needs_reference
def test_no_text_is_said_as_mlx_lm_says_it(capsys, monkeypatch):
    """A first token that stops generation: mlx-lm's "No text generated for this prompt", no summary."""
    argv = ["-p", "def parse_config(path):", "-m", "4"]
    assert main(["run", str(REFERENCE), "--json"] + argv) == 0
    first = json.loads(capsys.readouterr().out)["tokens"][0]
    expected = _mlx_lm_generate(monkeypatch, capsys, argv + ["--extra-eos-token", str(first)])
    assert gen.NO_TEXT in expected and "Generation:" not in expected
    assert main(["run", str(REFERENCE)] + argv + ["--extra-eos-token", str(first)]) == 0
    out = capsys.readouterr().out
    assert gen.NO_TEXT in out and "Generation:" not in out and "expert lookups" in out


def test_on_token_comes_as_each_token_is_out(tiny):
    """The per-token callback `workbench run` streams through: once per token, while decoding."""
    _, store = tiny("qwen3_moe", 4)
    with Engine(store, arena=3, progress=False) as eng:
        seen = []
        res = eng.generate(PROMPT, max_tokens=8, on_token=lambda t: seen.append((t, eng.step)))
    assert [t for t, _ in seen] == res.tokens and [s for _, s in seen] == list(range(1, 9))


@needs_reference
def test_counter_lines_add_up(capsys):
    """The text summary: arena + read-ahead + on demand = lookups, and the hit rate is the first two
    over the lookups (as printed)."""
    import re

    assert main(["run", str(REFERENCE), "-p", "def parse_config(path):", "-m", "16", "--lookahead", "1"]) == 0
    out = capsys.readouterr().out
    num = lambda label: int(re.search(rf"^\s*{label}\s+(\d+)", out, re.M).group(1))  # noqa: E731
    lookups, arena, ahead, demand = (num(k) for k in ("expert lookups", "from the arena", "by read-ahead",
                                                      "read on demand"))
    assert arena + ahead + demand == lookups and ahead > 0
    rate = float(re.search(r"^hit rate\s+([\d.]+)%", out, re.M).group(1))
    assert abs(rate - 100 * (arena + ahead) / lookups) < 0.06
    long_prompt = "def parse_config(path):\n    with open(path) as f:\n        return f.read()\n" * 3
    assert main(["run", str(REFERENCE), "-p", long_prompt, "-m", "2", "--arena", "0.25"]) == 0
    line = re.search(r"^prompt\s+(\d+) lookups: (\d+) from the arena, (\d+) by the next layer's read-ahead, "
                     r"(\d+) read on demand", capsys.readouterr().out, re.M)
    total, *parts = (int(g) for g in line.groups())
    assert sum(parts) == total and parts[1] > 0  # a long prompt reads the next layer ahead (Claims)


@needs_reference
@pytest.mark.parametrize("flags", [["--kv-bits", "4", "--quantized-kv-start", "110"], ["--max-kv-size", "64"],
                                   ["--prefill-step-size", "16"], ["--kv-bits", "8", "--kv-group-size", "32",
                                                                   "--quantized-kv-start", "0", "--prefill-step-size", "30"]],
                         ids=["kv-bits", "max-kv-size", "prefill-step", "all"])
def test_kv_flags_as_mlx_lm_generate(flags, capsys, monkeypatch):
    """--max-kv-size, --kv-bits/--kv-group-size/--quantized-kv-start and --prefill-step-size through
    mlx-lm's own cache classes: the same text as `mlx_lm generate` with the same flags."""
    from workbench.demo import demo_prompt

    argv = ["-p", demo_prompt(), "-m", "40", "--verbose", "F"] + flags  # 100 prompt tokens
    expected = _mlx_lm_generate(monkeypatch, capsys, argv)
    assert main(["run", str(REFERENCE), "--arena", "0.25", "--json"] + argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text"] + "\n" == expected and len(out["tokens"]) == 40
    if "--kv-bits" in flags or "--max-kv-size" in flags:  # the cache changed the numbers: the flags were used
        from workbench.cli import build_parser, kv_config

        kv = kv_config(build_parser().parse_args(["run"] + flags))
        logprobs = []
        for config in (kv, None):
            with Engine.open(REFERENCE, arena="25%", progress=False, **({"kv": config} if config else {})) as eng:
                logprobs.append(eng.generate(demo_prompt(), max_tokens=12).logprobs)
        assert not np.allclose(*logprobs, atol=1e-6)
