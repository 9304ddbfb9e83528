"""`make compare --family`: every run of the comparison gets the family, the default folder names it, and the
table/plot come from the runs' metrics."""

import json
from pathlib import Path

import pytest

import stare_verl.jobs.train as T
from stare_verl.jobs import compare


def test_compare_passes_the_family_to_every_run(tmp_path, monkeypatch):
    seen = []

    def fake_train_cpu(args):  # writes what a finished run leaves behind (a real run is the e2e tests' job)
        seen.append((args.family, args.method, args.seed, args.steps, args.cpu))
        run = Path(args.run_dir)
        run.mkdir(parents=True)
        ent = [0.13, 0.12] if args.method == "stare" else [0.13, 0.10]
        rows = [{"step": i + 1, "actor/entropy": e, "stare/target_entropy": 0.12, "stare/gate_on": float(e < 0.12),
                 "stare/cov_logp_adv_eff": 0.01 * (i + 1)}
                for i, e in enumerate(ent)]  # fmt: skip
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        ev = {"T=0": {"accuracy": 0.5}, "T=1": {"accuracy": 0.25, "pass_at_k": {"1": 0.25, "2": 0.4, "4": 0.5}}}
        assert args.eval_samples == 4
        summary = {
            "family": args.family,
            "method": args.method,
            "seed": args.seed,
            "eval_before": ev,
            "eval_after": ev,
        }
        (run / "summary.json").write_text(json.dumps(summary))
        return 0

    monkeypatch.setattr(T.cpu, "train_cpu", fake_train_cpu)
    monkeypatch.chdir(tmp_path)  # the default output folder is runs/compare-<family> under the working directory
    assert compare.main(["--family", "shortcot", "--steps", "2"]) == 0  # shortcot's default seeds: 0 1
    assert sorted(seen) == sorted(
        (f, m, s, 2, True) for f in ["shortcot"] for m in ("stare", "grpo") for s in (0, 1)
    )
    out = tmp_path / "runs" / "compare-shortcot"
    stats = json.loads((out / "table.json").read_text())
    assert {(s["method"], s["seed"]) for s in stats} == {("stare", 0), ("grpo", 0), ("stare", 1), ("grpo", 1)}
    grpo = next(s for s in stats if s["method"] == "grpo")
    assert grpo["entropy_last_quarter"] == 0.10 and grpo["gate_on_share"] == 0.5
    assert grpo["entropy_first_quarter"] == 0.13 and grpo["pass_at_k_after_t1"] == 0.5 and grpo["pass_k"] == 4
    # only methods that steer toward the target are measured against it
    assert grpo["mean_abs_entropy_minus_target"] is None and not grpo["has_target"]
    stare = next(s for s in stats if s["method"] == "stare")
    assert abs(stare["mean_abs_entropy_minus_target"] - 0.005) < 1e-12
    assert abs(grpo["entropy_ratio_last_first"] - 0.10 / 0.13) < 1e-12
    assert "pass@4 (T=1)" in (out / "table.md").read_text()
    assert grpo["cov_logp_adv_eff"] == [0.01, 0.02] and (out / "cov_overlay.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "accuracy_overlay.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "entropy_overlay.png").stat().st_size > 0 and "| stare | 2 |" in (
        out / "table.md"
    ).read_text()
    # other families: 30 steps, under runs/compare
    seen.clear()
    assert compare.main(["--family", "tooluse", "--seeds", "0", "1", "2"]) == 0
    assert sorted(seen) == sorted(("tooluse", m, s, 30, True) for m in ("stare", "grpo") for s in (0, 1, 2))
    assert (tmp_path / "runs" / "compare" / "table.md").exists()


def test_compare_checks_options_before_any_run(tmp_path, monkeypatch, capsys):
    def no_run(args):
        raise AssertionError("a run started")

    monkeypatch.setattr(T.cpu, "train_cpu", no_run)
    monkeypatch.chdir(tmp_path)
    for bad, word in ((["--steps", "0"], "--steps"), (["--eval-samples", "0"], "--eval-samples"),
                      (["--n-eval", "0"], "--n-eval")):  # fmt: skip
        assert compare.main(["--family", "shortcot", *bad]) == 2
        err = capsys.readouterr().err
        assert f"error: {word} must be in [1, " in err and "failed" not in err


def test_compare_runs_every_named_method_with_its_settings_and_refuses_unknown_ones(tmp_path, monkeypatch, capsys):
    seen = []

    def fake_train_cpu(args):
        seen.append((args.method, args.seed, Path(args.run_dir).name, tuple(args.overrides)))
        run = Path(args.run_dir)
        run.mkdir(parents=True)
        rows = [{"step": i + 1, "actor/entropy": 0.1, "entropy_control/cov_logp_adv_eff": 0.02,
                 "entropy_control/forking_entropy": 0.4, "timing_s/step": 3.0 + i} for i in range(4)]  # fmt: skip
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        ev = {"T=0": {"accuracy": 0.5}, "T=1": {"accuracy": 0.25, "pass_at_k": {"1": 0.25, "16": 0.9}}}
        (run / "summary.json").write_text(json.dumps({"method": args.method, "seed": args.seed, "eval_before": ev,
                                                      "eval_after": ev}))  # fmt: skip
        return 0

    monkeypatch.setattr(T.cpu, "train_cpu", fake_train_cpu)
    monkeypatch.chdir(tmp_path)
    methods = ["grpo", "forking", "entropy_bonus:coef=0.01", "kl_cov"]
    assert compare.main(["--family", "shortcot", "--steps", "4", "--seeds", "3", "--methods", *methods,
                         "--mini-batches", "2", "--eval-samples", "16"]) == 0  # fmt: skip
    assert [(m, d) for m, _, d, _ in seen] == [("grpo", "grpo-seed3"), ("forking", "forking-seed3"),
                                               ("entropy_bonus:coef=0.01", "entropy_bonus-coef0.01-seed3"),
                                               ("kl_cov", "kl_cov-seed3")]  # fmt: skip
    # off-policy: 2 updates of 4 prompts x 8 samples, each one micro-batch (verl needs whole micro-batches)
    assert all("actor_rollout_ref.actor.ppo_mini_batch_size=4" in o
               and "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32" in o for *_, o in seen)  # fmt: skip
    table = (tmp_path / "runs" / "compare-shortcot" / "table.md").read_text()
    assert "| entropy_bonus:coef=0.01 | 1 |" in table and "pass@16 (T=1)" in table and "off-policy (2 updates" in table
    stats = json.loads((tmp_path / "runs" / "compare-shortcot" / "table.json").read_text())
    assert stats[1]["seconds_per_step"] == 4.5 and stats[1]["forking_entropy"] == 0.4
    seen.clear()
    assert compare.main(["--methods", "stare", "clipcov"]) == 2  # every method checked before any run
    assert "error: --methods: unknown method 'clipcov'; known methods: grpo, stare" in capsys.readouterr().err
    assert seen == []


def test_a_run_with_more_samples_is_reported_at_the_comparisons_k(tmp_path):
    """A run folder evaluated with 16 samples per problem, reused in a 4-sample comparison, reports pass@4 (its
    unbiased estimate from 16 samples), not pass@16; without a k, or with a k it lacks, its largest k."""
    run = tmp_path / "grpo-seed0"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "actor/entropy": 0.1}) + "\n")
    passes = {"1": 0.65, "2": 0.84, "4": 0.95, "8": 0.99, "16": 1.0}
    ev = {"T=0": {"accuracy": 0.81}, "T=1": {"accuracy": 0.65, "pass_at_k": passes}}
    (run / "summary.json").write_text(json.dumps({"method": "grpo", "seed": 0, "eval_after": ev, "eval_before": ev}))
    at4 = compare.run_stats(run, pass_k=4)
    assert at4["pass_k"] == 4 and at4["pass_at_k_after_t1"] == 0.95
    assert at4["pass_at_k_curve"] == passes
    largest = compare.run_stats(run)
    assert largest["pass_k"] == 16 and largest["pass_at_k_after_t1"] == 1.0
    assert compare.run_stats(run, pass_k=32)["pass_k"] == 16


def test_compare_and_train_take_the_cold_start_variants(tmp_path, monkeypatch, capsys):
    """--sft-code-styles / --sft-anneal-ratio / --sft-anneal-steps / --sft-steps reach every run's SFT configuration
    (the README's code-styles table: the checkpoint of demo.sft with the same settings); bad values are refused
    before any run."""
    seen = []

    def fake_train_cpu(args):
        cfg = args.sft_config
        seen.append((cfg.code_styles, cfg.anneal_final_lr_ratio, cfg.anneal_steps, cfg.steps, cfg.init_seed,
                     cfg.train_seed, cfg.stop_accuracy, cfg.n_dev))
        return 1  # the comparison stops after the first run: enough to see its options

    monkeypatch.setattr(T.cpu, "train_cpu", fake_train_cpu)
    monkeypatch.chdir(tmp_path)
    assert compare.main(["--family", "tooluse", "--seeds", "0", "--sft-code-styles", "3", "--sft-anneal-ratio", "1.0",
                         "--sft-anneal-steps", "600", "--sft-steps", "2000"]) == 1  # fmt: skip
    assert seen == [(3, 1.0, 600, 2000, 0, 0, None, 64)]
    seen.clear()
    assert compare.main(["--family", "tooluse", "--seeds", "1", "--sft-code-styles", "3", "--sft-anneal-ratio", "1.0",
                         "--sft-anneal-steps", "1200", "--sft-steps", "2600", "--sft-seed", "2", "--sft-stop-accuracy",
                         "0.9", "--sft-stop-dev", "128"]) == 1  # the early-stopped table's checkpoint  # fmt: skip
    assert seen == [(3, 1.0, 1200, 2600, 2, 2, 0.9, 128)]
    seen.clear()
    assert compare.main(["--family", "tooluse", "--seeds", "0"]) == 1  # the family's cold start otherwise
    assert seen == [(1, 0.15, 300, 1300, 0, 0, None, 64)]
    lrs = []
    monkeypatch.setattr(T.cpu, "train_cpu", lambda args: lrs.append(args.sft_config.lr) or 1)
    assert compare.main(["--family", "tooluse", "--seeds", "0", "--sft-lr", "3e-3"]) == 1
    assert compare.main(["--family", "shortcot", "--seeds", "0", "--sft-lr", "1e-3"]) == 1
    assert lrs == [3e-3, 1e-3]
    monkeypatch.setattr(T.cpu, "train_cpu", fake_train_cpu)
    for bad, word in ((["--sft-code-styles", "4"], "--sft-code-styles"), (["--sft-anneal-ratio", "1.5"], "--sft-anneal-ratio"),
                      (["--sft-anneal-steps", "0"], "--sft-anneal-steps"), (["--sft-stop-dev", "0", "--sft-stop-accuracy", "0.9"], "--sft-stop-dev"),
                      (["--sft-stop-dev", "128"], "give --sft-stop-accuracy too"),
                      (["--sft-stop-dev", "99999999999", "--sft-stop-accuracy", "0.9"], "--sft-stop-dev must be in [1, 4096]"),
                      (["--sft-stop-accuracy", "1.5"], "--sft-stop-accuracy"), (["--sft-lr", "0"], "--sft-lr"),
                      (["--sft-lr", "nan"], "--sft-lr")):  # fmt: skip
        seen.clear()
        assert compare.main(["--family", "tooluse", "--seeds", "0", *bad]) == 2
        assert word in capsys.readouterr().err and seen == []
    assert compare.main(["--family", "shortcot", "--seeds", "0", "--sft-code-styles", "2"]) == 2
    assert "code_styles is for tool use" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["shortcot", "longcot"])
@pytest.mark.parametrize("opts", [["--sft-anneal-ratio", "0.5"], ["--sft-anneal-steps", "600"],
                                  ["--sft-anneal-ratio", "0.5", "--sft-anneal-steps", "600"]])  # fmt: skip
def test_anneal_options_are_refused_where_the_cold_start_has_no_anneal(family, opts, monkeypatch, capsys, tmp_path):
    """A family whose SFT has no anneal (the CoT ones) would train its default checkpoint with the anneal options
    silently ignored: train, compare and demo.sft refuse them before anything runs."""
    from stare_verl.jobs.demo import sft as S

    monkeypatch.setattr(T.cpu, "train_cpu", lambda args: pytest.fail("no run may start"))
    monkeypatch.chdir(tmp_path)
    assert compare.main(["--family", family, "--seeds", "0", *opts]) == 2
    err = capsys.readouterr().err
    assert f"the {family} SFT has none" in err and opts[0] in err
    assert T.main(["--family", family, "--dry-run", *opts]) == 2
    assert f"the {family} SFT has none" in capsys.readouterr().err
    demo_opts = [o.replace("--sft-anneal-ratio", "--anneal-final-lr-ratio").replace("--sft-", "--") for o in opts]
    with pytest.raises(SystemExit) as exc:
        S.main(["--family", family, "--out", str(tmp_path), *demo_opts])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "the anneal, which is off here" in err and "Value error" not in err
    # with the anneal turned on they are a variant of their own, as for tool use
    cfg = S.SFTConfig(family=family, anneal_below_loss=0.1, anneal_steps=600)
    assert cfg.anneal_steps == 600


@pytest.mark.parametrize(("methods", "overrides", "differ"), [
    (["stare:norm_adv_by_std_in_grpo=false", "grpo"], [], True),  # STARE's own setting: Dr.GRPO against GRPO
    (["stare", "forking:rho=0.2", "grpo"], ["algorithm.norm_adv_by_std_in_grpo=0"], False),  # one reading: all Dr.GRPO
    (["forking", "stare"], ["algorithm.norm_adv_by_std_in_grpo=false"], False),
    (["stare:epsilon=0.001", "grpo"], [], True),  # another epsilon
    (["stare:norm_adv_by_std_in_grpo=false", "grpo"], ["algorithm.norm_adv_by_std_in_grpo=false"], False),
    (["stare", "entropy_adv"], [], False),
])  # fmt: skip
def test_compare_refuses_methods_whose_baselines_differ(tmp_path, monkeypatch, capsys, methods, overrides, differ):
    ran = []
    monkeypatch.setattr(T.cpu, "train_cpu", lambda args: ran.append(args.method) or 7)  # stops at the first run
    monkeypatch.chdir(tmp_path)
    rc = compare.main(["--family", "shortcot", *overrides, "--seeds", "0", "--methods", *methods])
    err = capsys.readouterr().err
    if differ:
        assert rc == 2 and ran == [] and "GRPO baselines differ" in err
        assert all(f"{m}: " in err for m in methods)
    else:
        assert rc == 7 and ran == [methods[0]] and "baselines differ" not in err


def test_compare_refuses_a_norm_flag_that_is_no_boolean(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(T.cpu, "train_cpu", lambda args: pytest.fail("no run may start"))
    monkeypatch.chdir(tmp_path)
    assert compare.main(["--family", "shortcot", "algorithm.norm_adv_by_std_in_grpo=maybe", "--seeds", "0",
                         "--methods", "stare", "forking"]) == 2  # fmt: skip
    assert "algorithm.norm_adv_by_std_in_grpo must be a boolean" in capsys.readouterr().err


@pytest.mark.parametrize(("change", "why"), [
    (["--steps", "6"], "4 steps, not 6"), (["--n-eval", "9"], "5 held-out problems, not 9"),
    (["--eval-samples", "4"], "2 samples per problem, fewer than 4"), (["--eval-samples", "1"], None),
    ([], None),
    # the settings a run trained with (a fresh user's find: these were reused and relabelled)
    (["--lr", "0.0001"], "overrides none, not [actor_rollout_ref.actor.optim.lr=0.0001]"),
    (["--mini-batches", "2"], "overrides none, not [actor_rollout_ref.actor.ppo_mini_batch_size=4 "
                              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32]"),
    (["actor_rollout_ref.actor.clip_ratio_high=0.3"], "overrides none, not [actor_rollout_ref.actor.clip_ratio_high=0.3]"),
    (["--sft-seed", "3"], "sft_seed None, not 3"),
])  # fmt: skip
def test_a_finished_run_of_other_settings_is_not_reused(tmp_path, monkeypatch, capsys, change, why):
    """A finished run folder is the comparison's cache: one of another --steps, --n-eval, fewer --eval-samples or
    other training settings (--lr, --mini-batches, a Hydra override, a cold-start option) is refused with what
    differs, never reported as this comparison's."""
    ran = []

    def fake_train_cpu(args):
        ran.append(args.method)
        run = Path(args.run_dir)
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, "actor/entropy": 0.1}) + "\n"
                                                   for i in range(args.steps)))  # fmt: skip
        after = {"T=0": {"accuracy": 0.5, "n": args.n_eval},
                 "T=1": {"accuracy": 0.25, "n": args.n_eval * args.eval_samples,
                         "samples_per_problem": args.eval_samples, "pass_at_k": {"1": 0.25}}}  # fmt: skip
        (run / "summary.json").write_text(json.dumps({"method": args.method, "seed": args.seed, "steps": args.steps,
                                                      "settings": args.run_settings(),  # as the real run records
                                                      "eval_before": after, "eval_after": after}))  # fmt: skip
        return 0

    monkeypatch.setattr(T.cpu, "train_cpu", fake_train_cpu)
    monkeypatch.chdir(tmp_path)
    base = {"--steps": "4", "--n-eval": "5", "--eval-samples": "2"}
    argv = ["--family", "shortcot", "--seeds", "0", "--methods", "grpo"]
    assert compare.main([*argv, *[x for kv in base.items() for x in kv]]) == 0 and ran == ["grpo"]
    capsys.readouterr()
    flags, overrides = [c for c in change if "=" not in c], [c for c in change if "=" in c]
    opts = {**base, **dict(zip(flags[::2], flags[1::2], strict=True))}
    rc = compare.main([*argv, *[x for kv in opts.items() for x in kv], *overrides])
    err = capsys.readouterr().err
    assert ran == ["grpo"]  # the folder exists: never trained again
    if why:
        assert rc == 2 and f"holds a finished run of other settings ({why})" in err
    else:
        assert rc == 0 and "other settings" not in err


def _finishing_run(seen: list):
    """A stand-in for train_cpu that records the run's options and writes what a finished run leaves behind."""

    def run(args):
        seen.append(args)
        path = Path(args.run_dir)
        path.mkdir(parents=True)
        (path / "metrics.jsonl").write_text(json.dumps({"step": 1, "actor/entropy": 0.1}) + "\n")
        ev = {"T=0": {"accuracy": 0.5}, "T=1": {"accuracy": 0.25, "pass_at_k": {"1": 0.25}}}
        (path / "summary.json").write_text(json.dumps({"method": args.method, "seed": args.seed, "eval_before": ev,
                                                       "eval_after": ev}))  # fmt: skip
        return 0

    return run


def test_overrides_after_seeds_and_methods_end_them(tmp_path, monkeypatch):
    """``--seeds 0 1 key=value``: argparse's nargs took the override as a seed (invalid int) or a method."""
    seen = []
    monkeypatch.setattr(T.cpu, "train_cpu", _finishing_run(seen))
    monkeypatch.chdir(tmp_path)
    argv = ["--family", "shortcot", "--steps", "1", "--seeds", "0", "1", "algorithm.stare.target_entropy=0.2",
            "--methods", "grpo", "stare", "++trainer.val_before_train=false", "--eval-samples", "1"]  # fmt: skip
    assert compare.main(argv) == 0
    assert sorted((o.method, o.seed) for o in seen) == [("grpo", 0), ("grpo", 1), ("stare", 0), ("stare", 1)]
    assert {o.overrides for o in seen} == {("algorithm.stare.target_entropy=0.2", "++trainer.val_before_train=false")}


@pytest.mark.parametrize(("argv", "said"), [
    (["--seeds", "0", "-1"], "error: --seeds must be in [0, 2**32 - 1] (got -1)"),
    (["--methods", "stare", "clipcov"], "error: --methods: unknown method 'clipcov'; known methods: grpo, stare, "),
    (["--methods", "stare:reweight_w=1.5,reweight_w=2"], "error: --methods: method 'stare:reweight_w=1.5,reweight_w=2'"
                                                         ": setting reweight_w given twice; give each setting once"),
    (["--methods", "stare:reweight_w=1.1", "stare:reweight_w=1.10"], "error: --methods stare:reweight_w=1.1 and "
     "stare:reweight_w=1.10 are one run (method stare-reweight_w1.1, the same settings): give each method once"),
    (["--methods", "stare", "stare:"], "error: --methods stare and stare: are one run (method stare, the same "
                                        "settings): give each method once"),
    # given twice: one run counted twice in the mean and sd, refused like two spellings of one run (it was dropped)
    (["--seeds", "0", "1", "0"], "error: --seeds 0 given twice: give each once"),
    (["--methods", "stare", "grpo", "stare", "grpo"], "error: --methods stare grpo given twice: give each once"),
    (["--lr", "5"], "error: --lr must be in (0, 1] (got 5)"),
    (["--lr", "nan"], "error: --lr must be in (0, 1] (got nan)"),
    (["--steps", str(10**9)], "error: --steps must be in [1, 100000] (got 1000000000)"),
    (["actor_rollout_ref.actor.optim.lr="], "error: override 'actor_rollout_ref.actor.optim.lr=' gives "
                                            "actor_rollout_ref.actor.optim.lr no value: write one, "),
])  # fmt: skip
def test_compare_errors_name_its_own_options(argv, said, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(T.cpu, "train_cpu", lambda args: pytest.fail("a run started"))
    monkeypatch.chdir(tmp_path)
    assert compare.main(["--family", "shortcot", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and err.count("\n") == 1


def test_compare_help_gives_the_bounds_and_the_dry_run():
    text = " ".join(compare.build_parser().format_help().split())
    assert "actor learning rate for every run, in (0, 1]" in text and "(allowed: in [1, 100000])" not in text
    assert "30 otherwise; in [1, 100000])" in text and "default 200; in [1, 200])" in text
    assert "--dry-run check every run's options and print each run's plan" in text


@pytest.mark.integration
def test_compare_dry_run_plans_every_run_and_runs_nothing(tmp_path, monkeypatch, capsys):
    from stare_verl.jobs import backend
    from stare_verl.jobs.backend import GpuProbe

    monkeypatch.setattr(T.cpu, "train_cpu", lambda args: pytest.fail("a run started"))
    monkeypatch.setattr(backend, "probe_gpu", lambda: GpuProbe(gpu=False, name=None, sglang=False))
    monkeypatch.setenv("STARE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MODEL", raising=False)
    monkeypatch.chdir(tmp_path)
    assert compare.main(["--family", "shortcot", "--dry-run", "--seeds", "3", "--steps", "2", "--lr", "0.01",
                         "algorithm.stare.target_entropy=0.2"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "[compare] dry run 1/2: stare-seed3 (stare-verl train --family shortcot --cpu --run-dir " in out
    assert "[compare] dry run 2/2: grpo-seed3 (" in out
    commands = [ln for ln in out.splitlines() if "verl.trainer.main_ppo" in ln]
    assert len(commands) == 2 and all("actor_rollout_ref.actor.optim.lr=0.01" in c for c in commands)
    assert all("algorithm.stare.target_entropy=0.2" in c and "trainer.total_training_steps=2" in c for c in commands)
    assert out.count("ok: validates as verl would at launch") == 2
    assert out.rstrip().endswith("[compare] dry run of 2 shortcot runs: nothing was trained, written or launched")
    assert list(tmp_path.iterdir()) == []  # no run folder, no output folder, no SFT cache


def test_verl_import_warnings_stay_off_compare_s_console(tmp_path):
    """A fresh process (verl not imported yet): the only line on stderr is the error, not verl's engine and
    accelerator warnings (torchtitan, veomni, ... not available)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "stare_verl.jobs.compare", "--family", "shortcot", "--seeds", "0", "--out",
         str(tmp_path / "cmp"), "--methods", "stare:norm_adv_by_std_in_grpo=false", "grpo"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: the methods' GRPO baselines differ") and done.stderr.count("\n") == 1


@pytest.mark.parametrize(("argv", "said"), [
    (["data.max_response_length=0"], "error: data.max_response_length must be an integer >= 1 (got 0)\n"),
    (["--methods", "grpo", "stare", "actor_rollout_ref.rollout.n=0"],
     "error: actor_rollout_ref.rollout.n must be an integer >= 1 (got 0)\n"),
    (["algorithm.stare.reweight_ww=2"], "error: recipes/cpu/shortcot_tiny_stare.yaml with your overrides would fail "
     "at launch: override 'algorithm.stare.reweight_ww=2': no key algorithm.stare.reweight_ww in this recipe; did you "
     "mean algorithm.stare.reweight_w?\n"),
])  # fmt: skip
@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_compare_refuses_impossible_override_values_up_front(argv, said, dry_run, tmp_path, monkeypatch, capsys):
    """Each method's run config is checked as its run would check it (stare-verl train), before any run or plan."""
    monkeypatch.setattr(T.cpu, "train_cpu", lambda args: pytest.fail("a run started"))
    monkeypatch.chdir(tmp_path)
    assert compare.main(["--family", "shortcot", "--seeds", "0", *dry_run, *argv]) == 2
    out, err = capsys.readouterr()
    assert err == said and "dry run 1/" not in out
    assert list(tmp_path.iterdir()) == []
