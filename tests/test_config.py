"""The configuration objects: validation, the command line -> config mapping, one flag name per idea."""

from __future__ import annotations

import dataclasses
import json

import pytest

from workbench.cli import build_parser, engine_config, main
from workbench.config import AheadConfig, ArenaConfig, IOConfig, as_arena

SHAPE = dict(layers=4, experts=16, top_k=4, hidden=64, expert_width=32)


BAD = [
    (lambda: ArenaConfig("lots"), "cannot read arena size 'lots'"),
    (lambda: ArenaConfig("150%"), "arena percentage must be in (0, 100]"),
    (lambda: ArenaConfig("0"), "arena of 0 slots"),
    (lambda: ArenaConfig(True), "cannot read arena size True"),
    (lambda: ArenaConfig("2 XB"), "cannot read arena size"),
    (lambda: ArenaConfig(policy=""), "--policy is empty"),
    (lambda: ArenaConfig(policy_options="hot.txt"), "policy_options must be a dict"),
    (lambda: ArenaConfig(preload="yes"), "preload must be 'auto', True or False"),
    (lambda: IOConfig(workers=0), "--io-workers 0 is out of range"),
    (lambda: IOConfig(workers=100000), "--io-workers 100000 is out of range: give a value in [1, 256]"),
    (lambda: IOConfig(workers=2, reserved=3), "--io-reserved 3 is out of range"),
    (lambda: IOConfig(workers=2.5), "--io-workers must be a whole number"),
    (lambda: IOConfig(mode="fast"), "unknown read mode 'fast' (--io-mode); valid: buffered, dontneed, direct, nocache"),
    (lambda: IOConfig(verify="sometimes"), "unknown verify mode 'sometimes' (--verify)"),
    (lambda: AheadConfig(lookahead=0), "--lookahead 0 is out of range"),
    (lambda: AheadConfig(lookahead=1.5), "--lookahead must be a whole number"),
    (lambda: AheadConfig("none", lookahead=2), "--lookahead 2 reads ahead but --predictor is none"),
    (lambda: AheadConfig(""), "--predictor must be a name"),
    (lambda: AheadConfig("layer", width=0), "--ahead-width 0 is out of range"),
    (lambda: AheadConfig(mode="unpert2"), "unknown ahead mode 'unpert2' (--mode)"),
    (lambda: AheadConfig(mode="route", moce_bonus=0.0), "is the plain router"),
    (lambda: AheadConfig(moce_bonus=float("nan")), "--moce-bonus must be a finite number"),
    (lambda: AheadConfig(router="moce"), "unknown router 'moce' (--routing); valid: exact, cache_aware"),
    (lambda: AheadConfig(router="cache_aware", moce_bonus=0.0), "--routing cache_aware with --moce-bonus 0.0"),
    (lambda: AheadConfig(moce_protect=-1), "--moce-protect -1 is out of range"),
    (lambda: AheadConfig(moce_r1=-0.5), "--moce-r1 -0.5 is out of range"),
    (lambda: AheadConfig(gate="confidence"), "filters read-ahead candidates: also give --predictor"),
    (lambda: AheadConfig("layer", gate=3), "--gate must be a name"),
]


@pytest.mark.parametrize("make, msg", BAD, ids=[m for _, m in BAD])
def test_bad_values_give_one_clear_line(make, msg):
    with pytest.raises(ValueError) as e:
        make()
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_configs_are_frozen_and_keep_their_defaults():
    a = AheadConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.lookahead = 3
    assert (a.predictor, a.reads_ahead, a.distance) == ("none", False, 1)
    assert IOConfig() == IOConfig(workers=8, reserved=2, mode="buffered", verify="first")
    assert ArenaConfig() == ArenaConfig("0.25", "lru", None, None, "auto")
    assert as_arena("25%") == ArenaConfig("25%") and as_arena(None) == ArenaConfig()
    assert as_arena(ArenaConfig(4, "fifo")) == ArenaConfig(4, "fifo")


def test_a_lookahead_alone_implies_the_layer_predictor():
    assert AheadConfig(lookahead=2) == AheadConfig("layer", 2)
    assert AheadConfig(lookahead=2).reads_ahead
    assert AheadConfig("oracle").distance == 1 and AheadConfig("oracle").lookahead is None


def _run_args(*flags):
    return build_parser().parse_args(["run", "m", "--prompt-ids", "1"] + list(flags))


def test_cli_flags_map_onto_the_configs():
    kw = engine_config(_run_args())
    assert kw["arena"] == ArenaConfig("0.25", "lru")
    assert kw["io"] == IOConfig(verify="changed")  # the command line checks blobs again after a change
    assert kw["ahead"] == AheadConfig()
    assert (kw["decode"], kw["device"], kw["seed"]) == ("auto", None, None)
    kw = engine_config(_run_args("--arena", "2GiB", "--policy", "slru", "--slot-writes", "staged", "--io-workers", "4",
                                 "--io-reserved", "1", "--io-mode", "dontneed", "--verify", "never", "--decode", "layer",
                                 "--predictor", "prev", "--lookahead", "2", "--ahead-width", "6", "--mode", "route",
                                 "--moce-bonus", "1.5", "--moce-protect", "2", "--moce-r1", "0.1", "--gate", "confidence",
                                 "--seed", "7"))
    assert kw["arena"] == ArenaConfig("2GiB", "slru", writes="staged")
    assert kw["io"] == IOConfig(workers=4, reserved=1, mode="dontneed", verify="never")
    assert kw["ahead"] == AheadConfig("prev", 2, width=6, mode="route", moce_bonus=1.5, moce_protect=2, moce_r1=0.1,
                                      gate="confidence")
    assert (kw["decode"], kw["seed"]) == ("layer", 7)
    assert engine_config(_run_args("--policy", "static", "--hotlist", "hot.txt"))["arena"].options == {"hotlist": "hot.txt"}
    assert engine_config(_run_args("--lookahead", "3"))["ahead"] == AheadConfig("layer", 3)


def test_old_spellings_of_mode_are_hidden_aliases():
    assert engine_config(_run_args("--unpert", "0"))["ahead"].mode == "resident_bonus"
    assert engine_config(_run_args("--unpert", "1"))["ahead"].mode == "raw"
    assert engine_config(_run_args("--route"))["ahead"].mode == "cache_aware"
    with pytest.raises(SystemExit):
        _run_args("--unpert", "2")
    helps = build_parser()._subparsers._group_actions[0].choices
    assert "--unpert" not in helps["run"].format_help() and "--route" not in helps["run"].format_help()


def _options(parser) -> set:
    return {s for a in parser._actions for s in a.option_strings}


def test_one_flag_name_per_idea_across_commands():
    sub = build_parser()._subparsers._group_actions[0].choices
    for name in ("run", "demo", "simulate"):
        assert {"--predictor", "--lookahead", "--mode", "--ahead-width", "--moce-bonus", "--gate"} <= _options(sub[name])
    for name in ("run", "demo", "simulate", "ioreplay"):
        assert {"--io-workers", "--io-reserved", "--arena", "--policy"} <= _options(sub[name])
    assert {"--predictor", "--lookahead"} <= _options(sub["ioreplay"])
    assert {"--predictor", "--lookahead"} <= _options(sub["sweep"])
    retired = {"--distance", "--prefetch", "--urgent-workers"}
    for name, p in sub.items():
        assert not retired & _options(p), name
    for name in ("run", "demo", "simulate", "ioreplay"):
        assert "implies --predictor layer" in " ".join(sub[name].format_help().split())


def test_lookahead_without_predictor_reads_ahead_in_every_driver(tiny, tmp_path, capsys):
    """``--lookahead 1`` alone is ``--predictor layer --lookahead 1``: in the engine, in simulate (the
    recorded pred_layer column) and in ioreplay; without either flag nothing is read ahead."""
    _, store = tiny("qwen3_moe", 4, **SHAPE)
    trace = tmp_path / "t.parquet"
    run = ["run", str(store), "--prompt-ids", "9,4,27,31", "--max-tokens", "6", "--arena", "0.4", "--json"]
    outs = []
    for flags in (["--lookahead", "1", "--trace", str(trace)], ["--predictor", "layer", "--lookahead", "1"], []):
        capsys.readouterr()
        assert main(run + flags) == 0
        outs.append(json.loads(capsys.readouterr().out))
    implied, explicit, plain = outs
    assert implied["config"]["predictor"] == explicit["config"]["predictor"] == "layer"
    assert implied["stats"]["prefetch"]["issued"] > 0 and plain["stats"]["prefetch"]["issued"] == 0
    # the same reads and residency (a read's outcome, timely or late, depends on I/O timing)
    assert implied["stats"]["prefetch"]["issued"] == explicit["stats"]["prefetch"]["issued"]
    assert implied["stats"]["residency_hash"] == explicit["stats"]["residency_hash"]
    assert implied["tokens"] == explicit["tokens"] == plain["tokens"]

    def js(argv):
        capsys.readouterr()
        assert main(argv + ["--json"]) == 0
        return json.loads(capsys.readouterr().out)

    sim = ["simulate", str(trace), "--arena", "0.4"]
    assert js(sim + ["--lookahead", "1"]) == js(sim + ["--predictor", "layer", "--lookahead", "1"])
    assert js(sim + ["--lookahead", "1"])["prefetch"]["issued"] > 0 == js(sim)["prefetch"]["issued"]
    io = ["ioreplay", str(trace), str(store), "--arena", "0.4", "--compute-ms", "0"]
    implied, explicit = js(io + ["--lookahead", "1"]), js(io + ["--predictor", "layer"])
    assert implied["prefetch_source"] == explicit["prefetch_source"] == "layer"
    assert implied["prefetch"]["issued"] > 0 and js(io)["prefetch"]["issued"] == 0


def test_engine_takes_the_configs_and_refuses_other_types(tiny):
    from workbench.engine.engine import Engine

    _, store = tiny("qwen3_moe", 4, **SHAPE)
    with Engine(store, arena=ArenaConfig("0.5", "fifo"), io=IOConfig(workers=3, reserved=1),
                ahead=AheadConfig(lookahead=1), progress=False) as eng:
        assert eng.arena.policy.name == "fifo" and eng.n_slots == 32
        assert eng.planner is not None and eng.router is None and eng.ahead_config == AheadConfig("layer", 1)
    # the router apart from the ranking (the seed's UNPERT 2x2): raw ranking with the moce router, and
    # the bonus ranking with the exact router
    with Engine(store, arena="0.5", ahead=AheadConfig(lookahead=1, router="cache_aware"), progress=False) as eng:
        assert eng.router is not None and eng.planner.mode == "raw"
    with Engine(store, arena="0.5", ahead=AheadConfig(lookahead=1, mode="unpert0", router="exact"),
                progress=False) as eng:
        assert eng.router is None and eng.planner.mode == "resident_bonus"
    with Engine(store, arena="0.5", ahead=AheadConfig(lookahead=1, mode="unpert0"), progress=False) as eng:
        assert eng.router is not None  # unset: the mode decides, as before
    with pytest.raises(TypeError, match="IOConfig"):
        Engine(store, io={"workers": 3}, progress=False)
    with pytest.raises(TypeError, match="AheadConfig"):
        Engine(store, ahead="layer", progress=False)


def test_ioreplay_refuses_ahead_settings_it_cannot_replay(tiny, tmp_path):
    from workbench.sim.ioreplay import replay_io

    _, store = tiny("qwen3_moe", 4, **SHAPE)
    with pytest.raises(ValueError, match="use workbench simulate"):
        replay_io(tmp_path / "never-read.parquet", store, ahead=AheadConfig("layer", gate="confidence"))


def test_sweep_lookahead_alone_sweeps_the_layer_predictor(tmp_path):
    from workbench.cli_scale import sweep_grid

    def grid(*flags):
        return sweep_grid(build_parser().parse_args(["sweep", str(tmp_path / "t.parquet"), "--out", str(tmp_path / "o")]
                                                    + list(flags)))

    assert grid("--lookahead", "1,2").predictors == ["layer"] and grid("--lookahead", "1,2").distances == [1, 2]
    assert grid().predictors == ["none"]
    assert grid("--predictor", "none,oracle", "--lookahead", "1").predictors == ["none", "oracle"]
