"""``stare-verl train``'s options (``stare_verl.jobs.train.options.TrainOptions``): the command line and ``--help``
generated from the fields, the bounds as one-line errors, the round trip argv -> options -> argv, and what the
options resolve once (the family, the method, the SFT configuration)."""

from __future__ import annotations

import annotated_types
import pytest

from stare_verl.jobs.demo.sft import SFTConfig
from stare_verl.jobs.train import (
    SFT_OPTIONS,
    OptionsError,
    TrainOptions,
    build_parser,
    main,
    parse_options,
)


def _squeezed(text: str) -> str:
    return "".join(text.split())  # argparse wraps (and breaks at hyphens) the help lines


def test_help_lists_every_field_with_its_description():
    help_text = _squeezed(build_parser().format_help())
    for name, info in TrainOptions.model_fields.items():
        assert info.description, name
        flag = name if name == "overrides" else "--" + name.replace("_", "-")
        assert flag in help_text and _squeezed(info.description) in help_text, name
    # the generated --sft-* options carry the SFTConfig field they set
    assert "SFTConfig.init_seedandSFTConfig.train_seed" in help_text and "SFTConfig.n_dev" in help_text
    assert "[--cpu|--gpu]" in _squeezed(build_parser().format_usage())  # one group: mutually exclusive


def _bounds(info) -> tuple[float | None, float | None]:
    meta = [*info.metadata, *(m for a in getattr(info.annotation, "__args__", ()) for m in getattr(a, "__metadata__", ()))]
    lo = next((m.ge for m in meta if isinstance(m, annotated_types.Ge)), None)
    gt = next((m.gt for m in meta if isinstance(m, annotated_types.Gt)), None)
    return (lo if lo is not None else gt), next((m.le for m in meta if isinstance(m, annotated_types.Le)), None)


BOUNDED = [name for name, info in TrainOptions.model_fields.items() if _bounds(info) != (None, None)]


def test_every_numeric_option_has_bounds():
    numeric = [n for n, i in TrainOptions.model_fields.items() if "int" in str(i.annotation) or "float" in str(i.annotation)]
    assert sorted(BOUNDED) == sorted(numeric) and {"seed", "n_gpus", "sft_lr", "sft_seed"} <= set(BOUNDED)


@pytest.mark.parametrize("name", BOUNDED)
def test_a_value_out_of_bounds_is_one_line_naming_the_flag(name):
    lo, hi = _bounds(TrainOptions.model_fields[name])
    flag = "--" + name.replace("_", "-")
    for bad in ([lo - 1] if lo is not None else []) + ([hi + 1] if hi is not None else []):
        with pytest.raises(OptionsError) as err:
            TrainOptions.parse({name: bad})
        said = str(err.value)
        assert said.startswith(f"{flag} must be ") and said.endswith(f"(got {bad})") and "\n" not in said
        assert ("in [" in said or "in (" in said) == (lo is not None and hi is not None)
    edge = hi if hi is not None else lo  # a bound that is itself allowed (the lower ones here are >=)
    needs = {"sft_stop_accuracy": 0.5} if name == "sft_stop_dev" else {}  # the dev set of the early stop's checks
    assert getattr(TrainOptions.parse({name: edge, **needs}), name) == edge


@pytest.mark.parametrize(("argv", "said"), [
    (["--steps", "0"], "--steps must be in [1, 100000] (got 0)"),
    (["--steps", str(10**9)], "--steps must be in [1, 100000] (got 1000000000)"),
    (["--save-freq", "0"], "--save-freq must be in [1, 100000] (got 0)"),
    (["--n-eval", "201"], "--n-eval must be in [1, 200] (got 201)"),
    (["--method", "stare:reweight_w=1.5,reweight_w=2"], "--method: method 'stare:reweight_w=1.5,reweight_w=2': setting "
                                                        "reweight_w given twice; give each setting once"),
    (["actor_rollout_ref.actor.optim.lr="], "override 'actor_rollout_ref.actor.optim.lr=' gives "
                                            "actor_rollout_ref.actor.optim.lr no value: write one, "
                                            "actor_rollout_ref.actor.optim.lr=null for null or "
                                            "actor_rollout_ref.actor.optim.lr='' for an empty string"),
    (["--steps", "3", "+trainer.x=", "a=1"], "override '+trainer.x=' gives trainer.x no value: write one, "
                                             "+trainer.x=null for null"),
    (["~trainer.logger="], "override '~trainer.logger=' has an empty value: ~trainer.logger deletes trainer.logger"),
    (["trainer.logger"], "override 'trainer.logger' is no Hydra override (key=value, +key=value, ++key=value or "
                         "~key): missing EQUAL at '<EOF>'"),
    (["--seed", "-1"], "--seed must be in [0, 2**32 - 1] (got -1)"),
    (["--sft-lr", "2"], "--sft-lr must be in (0, 1] (got 2.0)"),
    (["--sft-lr", "inf"], "--sft-lr must be in (0, 1] (got inf)"),
    (["--n-gpus", "0", "--nnodes", "0"], "--n-gpus must be >= 1 (got 0); --nnodes must be >= 1 (got 0)"),
    (["--method", "stare:reweight_x=3"], "--method: invalid method stare config: method stare.reweight_x: unknown "
                                         "key; did you mean reweight_w? allowed keys: variant, "),
    (["--method", "clipcov"], "--method: unknown method 'clipcov'; known methods: grpo, stare, "),
    (["--method", "entropy_bonus:coef"], "--method: method 'entropy_bonus:coef': settings are key=value"),
    (["--logger", "console,slack"], "--logger: unknown logger slack"),
])  # fmt: skip
def test_bad_options_are_one_line_errors_with_status_2(argv, said, capsys):
    with pytest.raises(OptionsError) as err:
        parse_options(argv)
    assert str(err.value).startswith(said) and "\n" not in str(err.value)
    assert main(["--dry-run", *argv]) == 2
    out, printed = capsys.readouterr()
    assert printed == f"error: {err.value}\n" and out == ""


def test_an_explicit_null_or_empty_string_override_is_hydras_own():
    """``key=null`` (Hydra's null) and ``key=''`` (the empty string, written out) are overrides like any other."""
    given = ("actor_rollout_ref.actor.optim.lr=null", "trainer.project_name=''", '+trainer.x=""', "~trainer.logger")
    assert parse_options(list(given)).overrides == given


def test_overrides_may_stand_anywhere_among_the_options():
    """argparse alone took only the overrides at the end (``unrecognized arguments: b=2``); they keep their order."""
    opts = parse_options(["a.b=1", "--steps", "5", "c.d=2", "--seed", "2", "e.f=3", "--", "g.h=4"])
    assert (opts.steps, opts.seed, opts.overrides) == (5, 2, ("a.b=1", "c.d=2", "e.f=3", "g.h=4"))
    assert parse_options(["--run-dir", "x=1"]).run_dir == "x=1"  # an option's value is never taken as an override


def test_the_help_gives_each_bound_and_what_save_freq_0_means():
    help_text = " ".join(build_parser().format_help().split())
    assert "default 30; --model: 20) (allowed: in [1, 100000])" in help_text  # --steps
    assert "at most the 200 there are (default 200; --model: 100) (allowed: in [1, 200])" in help_text  # --n-eval
    assert "0 or less, verl's 'no checkpoint at all', is refused" in help_text
    assert "'off' or 'none' (or not given): off" in help_text  # --sft-stop-accuracy
    assert help_text.count("(allowed: in (0, 1])") == 0  # a description that gives its bounds is not repeated


@pytest.mark.parametrize("word", ["off", "none", "OFF", "None"])
def test_sft_stop_accuracy_off_is_the_family_s_default(word):
    opts = parse_options(["--sft-stop-accuracy", word])
    assert opts.sft_stop_accuracy is None and opts.sft_config == parse_options([]).sft_config
    assert opts.sft_config.stop_accuracy is None and opts.to_argv() == []


def test_sft_stop_accuracy_that_is_no_number_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as done:
        parse_options(["--sft-stop-accuracy", "high"])
    said = capsys.readouterr().err.splitlines()[-1]
    assert done.value.code == 2 and said.endswith("argument --sft-stop-accuracy: expected a number, off or none, got "
                                                  "'high'")  # fmt: skip


def test_usage_errors_stay_argparse_s(capsys):
    for argv, said in ((["--steps", "many"], "argument --steps: invalid int value: 'many'"),
                       (["--family", "nope"], "argument --family: invalid choice: 'nope'"),
                       (["--no-such-option"], "unrecognized arguments: --no-such-option")):  # fmt: skip
        with pytest.raises(SystemExit) as done:
            parse_options(argv)
        assert done.value.code == 2 and said in capsys.readouterr().err


def test_the_command_line_round_trips():
    argv = ["--family", "short_cot", "--method", "entropy_bonus:coef=0.01", "--rollout", "vllm", "--gpu", "--dry-run",
            "--gpu-recipe", "shortcot_qwen2.5-math-1.5b", "--n-gpus", "2", "--nnodes", "3", "--logger",
            "console,wandb,console", "--run-dir", "/tmp/r", "--model", "tiny", "--seed", "7", "--steps", "11", "--save-freq", "4",
            "--n-train", "64", "--n-eval", "9", "--eval-samples", "2", "--max-turns", "5", "--min-sft-accuracy", "0.25",
            "--warm-start-steps", "3", "--sft-threads", "2", "--sft-steps", "900", "--sft-seed", "3",
            "--sft-stop-accuracy", "0.9", "--sft-stop-dev", "32", "--sft-lr", "0.003",
            "algorithm.stare.target_entropy=0.2", "+trainer.val_before_train=false"]  # fmt: skip
    opts = parse_options(argv)
    assert (opts.family, opts.logger, opts.overrides) == (
        "shortcot", ["console", "wandb"], ("algorithm.stare.target_entropy=0.2", "+trainer.val_before_train=false"))
    again = parse_options(opts.to_argv())
    assert again.model_dump() == opts.model_dump()
    assert again.to_argv() == opts.to_argv() and "--family" in opts.to_argv()
    # every field but these is off its default here, so went through the command line and back
    defaults = TrainOptions()
    assert [n for n in TrainOptions.model_fields if getattr(opts, n) == getattr(defaults, n)] == [
        "cpu", "sft_cache", "sft_code_styles", "sft_anneal_ratio", "sft_anneal_steps"]  # --gpu; tool use's; a dir
    tool = parse_options(["--sft-code-styles", "2", "--sft-anneal-ratio", "0.5", "--sft-anneal-steps", "200"])
    assert parse_options(tool.to_argv()).model_dump() == tool.model_dump()
    assert TrainOptions().to_argv() == []  # the defaults (the model kind's included): nothing to say
    assert parse_options(["--model", "smollm2-135m"]).to_argv() == ["--model", "smollm2-135m"]


def test_options_resolve_the_family_the_method_and_the_sft_config_once(monkeypatch):
    from stare_verl import methods

    calls = []
    real = methods.parse_method_spec
    monkeypatch.setattr(methods, "parse_method_spec", lambda spec: calls.append(spec) or real(spec))
    opts = parse_options(["--family", "long_cot", "--method", "forking:rho=0.3", "--sft-seed", "4", "--sft-lr",
                          "0.001"])  # fmt: skip
    assert calls == ["forking:rho=0.3"]
    assert opts.job_family.name == "longcot" and opts.job_family is opts.job_family
    assert (opts.entropy_method.name, opts.entropy_method.label) == ("forking", "forking-rho0.3")
    cfg = opts.sft_config
    assert isinstance(cfg, SFTConfig) and (cfg.family, cfg.init_seed, cfg.train_seed, cfg.lr) == ("longcot", 4, 4, 1e-3)
    assert opts.model_copy(update={"run_dir": "/x"}).entropy_method is opts.entropy_method  # compare's per-run copy
    assert calls == ["forking:rho=0.3"]


def test_the_sft_options_are_the_sft_config_fields():
    for option, fields in SFT_OPTIONS.items():
        info, own = SFTConfig.model_fields[fields[0]], TrainOptions.model_fields[option]
        assert _bounds(own) == _bounds(info) and own.default is None, option
        said = (info.description or "").replace("None: off", "'off' or 'none' (or not given): off")  # typeable
        assert said in own.description and f"SFTConfig.{fields[0]}" in own.description
    assert parse_options(["--sft-stop-dev", "40", "--sft-stop-accuracy", "0.5"]).sft_config.n_dev == 40
    assert parse_options(["--sft-anneal-steps", "120"]).sft_config.anneal_steps == 120
    assert parse_options([]).sft_config == SFTConfig(family="tooluse")  # nothing given: the family's checkpoint


def test_the_defaults_of_the_model_kind_fill_only_what_was_not_given():
    tiny, real = TrainOptions(), TrainOptions.parse({"model": "smollm2-135m", "n_eval": 7})
    assert (tiny.steps, tiny.n_train, tiny.n_eval, tiny.eval_samples) == (30, 1024, 200, 1)
    assert (real.steps, real.n_train, real.n_eval, real.eval_samples) == (20, 512, 7, 4)
    with pytest.raises(OptionsError, match="--bogus: unknown option"):
        TrainOptions.parse({"bogus": 1})


@pytest.mark.parametrize("where, expected", [
    ("/proc/stare-run", "no folder can be made in /proc"),
    ("{file}/run", "is a file"),
])  # fmt: skip
def test_a_run_folder_that_cannot_be_made_is_refused_before_anything_runs(tmp_path, where, expected):
    from stare_verl.jobs.train.options import TrainOptions, bad_option

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    opts = TrainOptions.parse({"cpu": True, "run_dir": where.format(file=blocker)})
    problem = bad_option(opts)
    assert problem is not None and expected in problem and "--run-dir" in problem
    assert bad_option(TrainOptions.parse({"cpu": True, "run_dir": str(tmp_path / "new" / "run")})) is None
    assert not (tmp_path / "new").exists() and not list(tmp_path.glob(".stare-probe-*"))


def test_a_method_without_settings_says_so():
    from stare_verl.jobs.train.options import OptionsError, TrainOptions

    with pytest.raises(OptionsError, match="unknown key; it takes no settings"):
        TrainOptions.parse({"cpu": True, "method": "grpo:coef=1"})
