"""Live speculative decoding: a resident draft model, verify passes through the streamed target."""

import json

import mlx.core as mx
import pytest

from conftest import resident_greedy
from workbench import generate as gen
from workbench.cli import main
from workbench.data import REFERENCE
from workbench.engine.engine import Engine
from workbench.engine.speculative import speculative_generate

PROMPT = [5, 17, 3, 99, 42, 8, 77, 1, 64, 23, 11, 90, 31, 7, 56, 2, 88, 14, 70, 45]
DRAFT = REFERENCE.parent / "ref-draft"


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    """draft(kind, bits) -> a resident mlx-lm model sharing the tiny target's vocabulary."""
    from mlx_lm.utils import load_model

    from workbench.randmodel import make_random_model

    made = {}

    def build(model_dir, seed):
        if (model_dir, seed) not in made:
            path = model_dir if seed is None else make_random_model(
                tmp_path_factory.mktemp("draft") / "m", "qwen3_moe", seed=seed, moving=True, layers=1, experts=4,
                top_k=2, hidden=32, expert_width=16, vocab=128)
            made[(model_dir, seed)] = load_model(path)[0]
        return made[(model_dir, seed)]

    return build


@pytest.mark.parametrize("bits", [None, 4])
def test_greedy_speculative_equals_plain_greedy(tiny, drafts, bits):
    model_dir, store = tiny("qwen3_moe", bits)
    ref, _ = resident_greedy(model_dir, PROMPT, 16)
    for seed, accept in ((2, "low"), (None, "all")):  # a random draft, and the target itself as draft
        draft = drafts(model_dir, seed)
        for n in (1, 3, 5):
            with Engine(store, arena="0.25", progress=False) as eng:
                res = speculative_generate(eng, draft, PROMPT, max_tokens=16, num_draft_tokens=n)
            assert res.tokens == ref, f"bits={bits} draft={seed} n={n}"
            sp = res.stats["speculative"]
            assert sp["drafted"] >= sp["accepted"] and sp["verify_passes"] * (n + 1) >= 16
            if accept == "all":
                assert sp["acceptance"] == 1.0 and sp["verify_passes"] == -(-16 // (n + 1))
            assert res.stats["misses"] > 0 and sp["bytes_read_per_pass"] > 0
            # a pass claims the union of its tokens' experts: more than one token's, at most all of them
            if n > 1:
                assert eng.top_k * 2 < sp["union_experts_per_pass"] <= (n + 1) * eng.top_k * 2


def test_sampled_speculative_equals_mlx_lm(tiny, drafts):
    """At temperature > 0 the streamed run makes mlx-lm's speculative_generate_step's choices."""
    from mlx_lm.generate import speculative_generate_step
    from mlx_lm.utils import load_model

    model_dir, store = tiny("qwen3_moe", 4)
    target, _ = load_model(model_dir)
    for seed in (2, None):
        draft = drafts(model_dir, seed)
        mx.random.seed(5)
        steps = speculative_generate_step(mx.array(PROMPT), target, draft, num_draft_tokens=3, max_tokens=16,
                                          sampler=gen.make_sampler(temp=3.0))
        ref = [int(t) for (t, _, _), _ in zip(steps, range(16))]
        with Engine(store, arena="0.25", progress=False) as eng:
            mx.random.seed(5)
            res = speculative_generate(eng, draft, PROMPT, max_tokens=16, num_draft_tokens=3,
                                       sampler=gen.make_sampler(temp=3.0))
        assert res.tokens == ref
    assert ref != resident_greedy(model_dir, PROMPT, 16)[0]


def test_speculative_stops_at_eos(tiny, drafts):
    model_dir, store = tiny("qwen3_moe", 4)
    ref, _ = resident_greedy(model_dir, PROMPT, 16)
    stop = ref[6]
    with Engine(store, arena="0.25", progress=False) as eng:
        res = speculative_generate(eng, drafts(model_dir, None), PROMPT, max_tokens=16, num_draft_tokens=4,
                                   eos_token_ids=[stop])
    assert res.tokens == ref[:ref.index(stop) + 1]


@pytest.mark.skipif(not (DRAFT / "config.json").exists(), reason="reference models not shipped")
def test_reference_draft_through_the_cli_matches_plain_streaming(capsys):
    from workbench.data import workload

    text = workload("code_heldout")[0]["text"][:400]
    outs = {}
    for name, extra in (("plain", []), ("spec", ["--draft-model", str(DRAFT), "--num-draft-tokens", "3"])):
        capsys.readouterr()
        assert main(["run", str(REFERENCE), "-p", text, "--max-tokens", "20", "--arena", "0.1", "--json"] + extra) == 0
        outs[name] = json.loads(capsys.readouterr().out)
    assert outs["spec"]["tokens"] == outs["plain"]["tokens"]
    sp = outs["spec"]["stats"]["speculative"]
    assert sp["accepted"] > 0 and sp["verify_passes"] < 20  # the trained draft agrees often
    assert sp["bytes_read_per_pass"] > outs["plain"]["stats"]["bytes_per_token"]
    assert outs["spec"]["config"]["draft_model"] == str(DRAFT) and outs["spec"]["config"]["num_draft_tokens"] == 3
    assert main(["run", str(REFERENCE), "-p", "x", "--max-tokens", "3", "--draft-model", str(DRAFT),
                 "--compare-plain"]) == 0
    out = capsys.readouterr().out
    assert "acceptance" in out and "vs plain streaming" in out


def test_draft_with_another_vocabulary_is_refused(tiny, capsys):
    model_dir, store = tiny("qwen3_moe", 4)
    other, _ = tiny("mixtral", None, vocab=256)
    assert main(["run", str(store), "--prompt-ids", "1,2", "--draft-model", str(other)]) == 2
    assert "share the target's tokenizer" in capsys.readouterr().err


def test_full_arena_verify_passes_read_nothing(tiny, drafts):
    model_dir, store = tiny("qwen3_moe", 4)
    ref, _ = resident_greedy(model_dir, PROMPT, 16)
    with Engine(store, arena="1.0", progress=False) as eng:
        eng.generate(list(range(0, 128, 3)), max_tokens=2)  # touch every expert
        res = speculative_generate(eng, drafts(model_dir, 2), PROMPT, max_tokens=16, num_draft_tokens=3)
    assert res.tokens == ref
    assert res.stats["misses"] == 0 and res.stats["hits"] > 0 and res.stats["speculative"]["bytes_read_per_pass"] == 0
