"""Every recipe composes on verl's ppo_trainer and passes verl's own config validation on CPU, from any working
directory (the recipes are found as package data and name their files by absolute paths)."""

import pytest
from omegaconf import OmegaConf

from stare_verl.jobs.recipes import compose_recipe, recipe_names, validate_recipe

pytestmark = pytest.mark.integration

RECIPES = recipe_names()


def test_every_family_has_stare_and_grpo_versions():
    stare = {r[: -len("_stare")] for r in RECIPES if r.endswith("_stare")}
    grpo = {r[: -len("_grpo")] for r in RECIPES if r.endswith("_grpo")}
    assert stare == grpo
    assert {s.split("_")[0] for s in stare} == {"shortcot", "longcot", "tooluse"}
    assert len(stare) == 6
    assert "shortcot_qwen2.5-math-1.5b" in stare  # the 1.5B pair (issue 32 item 4)


def test_the_1_5b_shortcot_recipe_is_the_7b_one_scaled(monkeypatch, tmp_path):
    """shortcot_qwen2.5-math-1.5b_{stare,grpo} differ from the 7B pair only in what their base recipe's comment
    says (the model, GPUs per node, the micro-batch token budget) and the experiment name; verl derives the
    log-prob budgets from the actor's."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MODEL", raising=False)
    for method in ("stare", "grpo"):
        small = OmegaConf.to_container(compose_recipe(f"shortcot_qwen2.5-math-1.5b_{method}", resolve=False))
        big = OmegaConf.to_container(compose_recipe(f"shortcot_qwen2.5-math-7b_{method}", resolve=False))
        diff = {k: (big_v, small_v) for k, big_v, small_v in _leaves(big, small) if big_v != small_v}
        name = {"stare": "stare", "grpo": "grpo-ds"}[method]
        assert diff == {
            "actor_rollout_ref.model.path": ("${oc.env:MODEL,Qwen/Qwen2.5-Math-7B}",
                                             "${oc.env:MODEL,Qwen/Qwen2.5-Math-1.5B}"),
            "trainer.n_gpus_per_node": (8, 4),
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": (16384, 32768),
            "trainer.experiment_name": (f"shortcot_qwen2.5-math-7b-{name}", f"shortcot_qwen2.5-math-1.5b-{name}"),
        }  # fmt: skip
        cfg = compose_recipe(f"shortcot_qwen2.5-math-1.5b_{method}")
        assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-Math-1.5B"
        assert cfg.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == 32768
        assert cfg.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == 32768
        assert cfg.data.max_prompt_length + cfg.data.max_response_length == 4096  # the model's context


def _leaves(a, b, prefix=""):
    """(dotted key, value in a, value in b) of every leaf of two nested dicts (None where one lacks it)."""
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            yield from _leaves(x, y, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", x, y


@pytest.mark.parametrize("name", [r for r in RECIPES if r.endswith(("_stare", "_grpo"))])
def test_gpu_recipe_composes_and_validates(name, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    cfg = compose_recipe(name)
    stare = validate_recipe(cfg)
    assert cfg.trainer.v1.trainer_mode == "token_stats_sync"
    assert cfg.actor_rollout_ref.rollout.name == "sglang"
    reward_module = "pkg://envs.tool_use.task" if name.startswith("tooluse") else "pkg://envs.reward"
    assert cfg.reward.custom_reward_function.path == reward_module
    if name.endswith("_grpo"):
        assert (stare.reweight_w, stare.reweight_m) == (1.0, 1.0)
        twin = compose_recipe(name[: -len("_grpo")] + "_stare", resolve=False)
        raw = compose_recipe(name, resolve=False)
        for key in ("algorithm.stare.reweight_w", "algorithm.stare.reweight_m", "trainer.experiment_name"):
            OmegaConf.update(raw, key, OmegaConf.select(twin, key))
        assert raw == twin  # identical but for reweighting
    else:
        assert stare.reweight_w > 1.0
    if name.startswith("tooluse"):
        assert cfg.actor_rollout_ref.rollout.multi_turn.enable
        assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "stare_tool_agent"


def test_a_broken_recipe_fails_validation(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    cfg = compose_recipe("shortcot_qwen2.5-math-7b_stare", ["+algorithm.stare.top_p_raito=0.2"])
    with pytest.raises(Exception, match="top_p_raito"):
        validate_recipe(cfg)
    cfg = compose_recipe("shortcot_qwen2.5-math-7b_stare", ["actor_rollout_ref.actor.loss_agg_mode=bogus"])
    with pytest.raises(Exception, match="loss_agg_mode"):
        validate_recipe(cfg)
    for bad, key in (
        ("trainer.v1.trainer_mode=sync", "trainer_mode"),
        ("algorithm.rollout_correction.bypass_mode=true", "bypass_mode"),
    ):
        with pytest.raises(Exception, match=key):
            validate_recipe(compose_recipe("shortcot_qwen2.5-math-7b_stare", [bad]))
    cfg = compose_recipe("shortcot_qwen2.5-math-7b_stare", ["+actor_rollout_ref.rollout.max_tokenz=8"])
    with pytest.raises(Exception, match="max_tokenz"):
        validate_recipe(cfg)


def test_cli_check_reports_ok_and_errors(capsys, monkeypatch, tmp_path):
    from stare_verl.jobs.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["check", "shortcot_qwen2.5-32b_stare", "algorithm.stare.variant=C2"]) == 0
    assert "variant=C2" in capsys.readouterr().out
    assert main(["check", "shortcot_qwen2.5-32b_stare", "algorithm.stare.variant=X9"]) == 2
    assert "algorithm.stare.variant" in capsys.readouterr().err
    # an error is not preceded by verl's "All configuration checks passed" line
    assert main(["check", "shortcot_qwen2.5-32b_stare", "trainer.v1.trainer_mode=sync"]) == 2
    out, err = capsys.readouterr()
    assert "checks passed" not in out and "token_stats_sync" in err
    # recipes in a sub-folder, e.g. the CPU ones
    assert main(["check", "cpu/longcot_tiny_grpo", "actor_rollout_ref.model.path=m"]) == 0
    out = capsys.readouterr().out
    assert "rollout=hf" in out and "W=1.0 M=1.0" in out
    # an unknown name is one line with a hint, not Hydra's search path
    assert main(["check", "longcot_tiny_grpo"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: no recipe 'longcot_tiny_grpo'; did you mean cpu/longcot_tiny_grpo? (stare-verl recipes lists them)"
    )
    assert main(["check", "cpu/longcot_tiny_grpo.yaml", "actor_rollout_ref.model.path=m"]) == 0
    # an empty value would compose as the empty string and pass: one line naming the key (key=null is Hydra's null)
    assert main(["check", "cpu/longcot_tiny_grpo", "actor_rollout_ref.model.path=m", "actor_rollout_ref.actor.optim.lr="]) == 2
    assert capsys.readouterr().err == (
        "error: override 'actor_rollout_ref.actor.optim.lr=' gives actor_rollout_ref.actor.optim.lr no value: write "
        "one, actor_rollout_ref.actor.optim.lr=null for null or actor_rollout_ref.actor.optim.lr='' for an empty string\n"
    )
    from stare_verl.jobs.recipes import compose_recipe

    with pytest.raises(ValueError, match="^override 'trainer.logger=' gives trainer.logger no value"):
        compose_recipe("cpu/longcot_tiny_grpo", ["trainer.logger="])


def test_cli_check_takes_a_path_or_a_users_own_verl_yaml_and_suggests_names(capsys, monkeypatch, tmp_path):
    """Issue 32 item 2: a recipe by path (relative, ./, absolute), the user's own verl YAML (no defaults list:
    composed on verl's ppo_trainer), and a did-you-mean for a misspelled name."""
    from stare_verl.jobs.cli import main
    from stare_verl.jobs.recipes import recipes_dir

    monkeypatch.chdir(recipes_dir().parent)
    for arg in ("recipes/cpu/tooluse_tiny_stare.yaml", "./recipes/cpu/tooluse_tiny_stare.yaml",
                str(recipes_dir() / "cpu" / "tooluse_tiny_stare.yaml")):  # fmt: skip
        assert main(["check", arg, "actor_rollout_ref.model.path=m"]) == 0, arg
        assert "rollout=hf" in capsys.readouterr().out
    own = tmp_path / "my_run.yaml"
    own.write_text(
        "algorithm: {adv_estimator: stare, stare: {variant: C2}}\n"
        "trainer: {v1: {trainer_mode: stare_sync}}\n"
        "actor_rollout_ref:\n"
        "  actor: {ppo_micro_batch_size_per_gpu: 2}\n"
        "  rollout: {name: sglang, log_prob_micro_batch_size_per_gpu: 2}\n"
        "  ref: {log_prob_micro_batch_size_per_gpu: 2}\n"
    )
    assert main(["check", str(own), "actor_rollout_ref.model.path=m", "algorithm.stare.target_entropy=0.25"]) == 0
    out = capsys.readouterr().out
    assert "variant=C2" in out and "target=0.25 nats" in out and "rollout=sglang" in out
    # the user's file is checked as verl would: a key verl needs is reported, not passed over
    own.write_text("algorithm: {adv_estimator: stare}\ntrainer: {v1: {trainer_mode: stare_sync}}\n")
    assert main(["check", str(own), "actor_rollout_ref.model.path=m"]) == 2
    assert "micro_batch_size" in capsys.readouterr().err
    # ... but a bad STARE value in the same minimal file is named first, not after verl's mandatory keys
    own.write_text("algorithm: {adv_estimator: stare, stare: {variant: O3}}\n"
                   "trainer: {v1: {trainer_mode: stare_sync}}\n")  # fmt: skip
    assert main(["check", str(own), "actor_rollout_ref.model.path=m"]) == 2
    err = capsys.readouterr().err
    assert "algorithm.stare.variant" in err and "O3" in err and "micro_batch_size" not in err, err
    own.write_text("- not\n- a mapping\n")
    assert main(["check", str(own)]) == 2
    assert "no YAML mapping" in capsys.readouterr().err
    assert main(["check", "tooluse_tiny_star"]) == 2
    assert "did you mean cpu/tooluse_tiny_stare" in capsys.readouterr().err
    assert main(["check", "shortcot_qwen25-math-7b_stare"]) == 2
    assert "did you mean shortcot_qwen2.5-math-7b_stare" in capsys.readouterr().err
    assert main(["check", "tooluse_tiny_stare.yaml"]) == 2
    assert "did you mean cpu/tooluse_tiny_stare?" in capsys.readouterr().err
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)))
    for path, what in ((binary, "a file"), (tmp_path, "a folder")):  # they exist: not "no file"
        assert main(["check", str(path)]) == 2
        assert capsys.readouterr().err.strip() == (
            f"error: {str(path)!r} is {what}, not a recipe: give a recipe name or a .yaml / .yml verl config"
        )
    assert main(["check", ""]) == 2  # not "'' is a folder" (Path('') is the working folder)
    assert capsys.readouterr().err.strip().startswith("error: an empty recipe name")
    assert main(["check", "nothing/like/this.yaml"]) == 2
    assert capsys.readouterr().err.startswith("error: no file 'nothing/like/this.yaml'")
    assert main(["check", "zzzzzzzz"]) == 2
    assert capsys.readouterr().err.strip() == "error: no recipe 'zzzzzzzz' (stare-verl recipes lists them)"


def test_stares_defaults_are_written_once_and_are_stare_configs():
    """STARE's defaults live in one recipe file, cpu/base/stare_defaults.yaml, equal to StareConfig's (the Python
    defaults a missing key takes); the GPU and CPU common files include it, and no other recipe file writes an
    ``algorithm.stare`` key at its default value (a file sets only what it changes)."""
    from pathlib import Path

    from stare_verl.jobs.recipes import recipes_dir
    from stare_verl.methods.stare.config import StareConfig

    root = recipes_dir()
    shared = root / "cpu" / "base" / "stare_defaults.yaml"
    algo = OmegaConf.to_container(OmegaConf.load(shared))["algorithm"]
    assert algo["stare"] == StareConfig().model_dump()
    assert {k: algo[k] for k in ("adv_estimator", "norm_adv_by_std_in_grpo", "use_kl_in_reward")} == {
        "adv_estimator": "stare", "norm_adv_by_std_in_grpo": True, "use_kl_in_reward": False}  # fmt: skip
    assert OmegaConf.load(root / "common" / "stare_reference.yaml").defaults[0] == "/cpu/base/stare_defaults"
    assert OmegaConf.load(root / "cpu" / "base" / "cpu_common.yaml").defaults[0] == "stare_defaults"
    defaults = StareConfig().model_dump()
    for path in sorted(Path(root).rglob("*.yaml")):
        own = OmegaConf.to_container(OmegaConf.load(path))
        stare = (own.get("algorithm") or {}).get("stare") if isinstance(own, dict) else None
        if path == shared or not stare:
            continue
        assert {k: v for k, v in stare.items() if defaults.get(k, object()) == v} == {}, path
    for name in ("shortcot_qwen2.5-math-7b_stare", "cpu/shortcot_tiny_stare", "cpu/tooluse_real_stare"):
        stare = compose_recipe(name, ["actor_rollout_ref.model.path=m"], resolve=False).algorithm.stare
        assert stare.alpha == 0.01 and stare.reweight_m == 0.9, name  # from the shared file
    assert compose_recipe("cpu/shortcot_tiny_stare", ["actor_rollout_ref.model.path=m"]).algorithm.stare == {
        **defaults, "top_p_ratio": 0.02, "reweight_w": 3.0, "target_entropy": 0.11}  # the family's own on top


def test_every_stare_recipe_writes_every_key_so_plain_overrides_work(capsys, monkeypatch, tmp_path):
    """Issue 32 item 3: every recipe with an ``algorithm.stare`` section has every key of StareConfig, at the
    model's default where the recipe does not choose one, so the README's ``algorithm.stare.KEY=value`` runs as
    written on CPU and GPU recipes alike."""
    from stare_verl.jobs.cli import main
    from stare_verl.jobs.recipes import recipe_names, recipes_dir
    from stare_verl.methods.stare.config import StareConfig

    defaults = StareConfig().model_dump()
    chosen = {"variant", "top_p_ratio", "reweight_w", "reweight_m", "target_entropy"}  # per family / recipe
    cpu = recipes_dir() / "cpu"
    names = recipe_names() + [f"cpu/{n}" for n in recipe_names(cpu) if "stare" in (cpu / f"{n}.yaml").read_text()]
    seen = 0
    for name in names:
        stare = compose_recipe(name, ["actor_rollout_ref.model.path=m"]).algorithm.get("stare")
        if stare is None:
            continue
        seen += 1
        assert set(stare) == set(defaults), name
        assert {k: stare[k] for k in defaults if k not in chosen} == {
            k: v for k, v in defaults.items() if k not in chosen
        }, name
    assert seen >= 16
    monkeypatch.chdir(tmp_path)
    for name in ("shortcot_qwen2.5-math-7b_stare", "cpu/shortcot_tiny_stare"):
        ov = ["actor_rollout_ref.model.path=m", "algorithm.stare.adaptive=true", "algorithm.stare.alpha=0.05",
              "algorithm.stare.w_max=3", "algorithm.stare.scope=chunk", "algorithm.stare.chunk_size=4"]  # fmt: skip
        assert main(["check", name, *ov]) == 0, capsys.readouterr().err
        assert "ok:" in capsys.readouterr().out


# the keys the CPU recipes leave to the driver (???)
PLACEHOLDERS = ["actor_rollout_ref.model.path=x", "data.train_files=x", "data.val_files=x",
                "trainer.default_local_dir=x"]  # fmt: skip


@pytest.mark.parametrize(("override", "said"), [
    ("data.max_response_length=0", "data.max_response_length must be an integer >= 1 (got 0)"),
    ("data.max_response_length=-5", "data.max_response_length must be an integer >= 1 (got -5)"),
    ("data.max_response_length=12.0", "data.max_response_length must be an integer >= 1 (got 12.0)"),
    ("data.max_prompt_length=null", "data.max_prompt_length must be an integer >= 1 (got None)"),
    ("actor_rollout_ref.actor.optim.lr=-1", "actor_rollout_ref.actor.optim.lr must be a number in (0, 1] (got -1)"),
    ("actor_rollout_ref.actor.optim.lr=abc",
     "actor_rollout_ref.actor.optim.lr must be a number in (0, 1] (got 'abc')"),
    ("actor_rollout_ref.actor.optim.lr=nan", "actor_rollout_ref.actor.optim.lr must be a number in (0, 1] (got nan)"),
    ("actor_rollout_ref.actor.optim.lr=2", "actor_rollout_ref.actor.optim.lr must be a number in (0, 1] (got 2)"),
    ("actor_rollout_ref.rollout.n=0", "actor_rollout_ref.rollout.n must be an integer >= 1 (got 0)"),
    ("actor_rollout_ref.rollout.n=true", "actor_rollout_ref.rollout.n must be an integer >= 1 (got True)"),
    ("actor_rollout_ref.rollout.temperature=-1",
     "actor_rollout_ref.rollout.temperature must be a number >= 0 (got -1)"),
    ("actor_rollout_ref.rollout.temperature=0", "actor_rollout_ref.rollout.temperature must be > 0 when "
     "actor_rollout_ref.rollout.do_sample is true (got 0; 0 is greedy: actor_rollout_ref.rollout.do_sample=false)"),
    ("actor_rollout_ref.rollout.top_p=0", "actor_rollout_ref.rollout.top_p must be a number in (0, 1] (got 0)"),
    ("actor_rollout_ref.rollout.top_p=1.5", "actor_rollout_ref.rollout.top_p must be a number in (0, 1] (got 1.5)"),
    ("actor_rollout_ref.actor.ppo_epochs=0", "actor_rollout_ref.actor.ppo_epochs must be an integer >= 1 (got 0)"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=0",
     "actor_rollout_ref.actor.ppo_mini_batch_size must be an integer >= 1 (got 0)"),
    ("data.train_batch_size=0", "data.train_batch_size must be an integer >= 1 (got 0)"),
    ("actor_rollout_ref.actor.clip_ratio_low=-0.2",
     "actor_rollout_ref.actor.clip_ratio_low must be a number > 0 (got -0.2)"),
    ("actor_rollout_ref.actor.entropy_coeff=-0.01",
     "actor_rollout_ref.actor.entropy_coeff must be a number >= 0 (got -0.01)"),
    ("actor_rollout_ref.actor.entropy_coeff=inf",
     "actor_rollout_ref.actor.entropy_coeff must be a number >= 0 (got inf)"),
    ("trainer.total_training_steps=0", "trainer.total_training_steps must be an integer >= 1 (got 0)"),
    ("algorithm.gamma=1.5", "algorithm.gamma must be a number in [0, 1] (got 1.5)"),
])  # fmt: skip
def test_impossible_values_of_overrides_are_named_in_one_line(override, said, monkeypatch, tmp_path):
    """verl's own checks pass these (its config dataclasses check no ranges): the workers would fail on them, or
    train with them, minutes into a run. config_problem names each, validate_recipe (stare-verl check) too."""
    from stare_verl.jobs.recipes import config_problem

    monkeypatch.chdir(tmp_path)
    cfg = compose_recipe("cpu/shortcot_tiny_stare", [*PLACEHOLDERS, override])
    assert config_problem(cfg) == said
    with pytest.raises(ValueError) as err:
        validate_recipe(cfg)
    assert str(err.value) == said


@pytest.mark.parametrize(("overrides", "said"), [
    # 2 prompts a mini-batch x 8 samples = 16 sequences, in micro-batches of 64: verl stops at the first update
    (["actor_rollout_ref.actor.ppo_mini_batch_size=2"],
     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu must divide each rank's mini-batch, ppo_mini_batch_size "
     "x rollout.n / ranks = 2 x 8 / 1 sequences (got 64; verl would stop at the first update)"),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=3", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"],
     "data.train_batch_size must be a multiple of actor_rollout_ref.actor.ppo_mini_batch_size (got 8 and 3 prompts)"),
    (["trainer.n_gpus_per_node=3", "ray_kwargs.ray_init.num_gpus=3", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"],
     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu must divide each rank's mini-batch, ppo_mini_batch_size "
     "x rollout.n / ranks = 8 x 8 / 3 sequences (got 8; verl would stop at the first update)"),
    (["trainer.n_gpus_per_node=2", "ray_kwargs.ray_init.num_gpus=2"],  # 32 sequences a rank, micro-batches of 64
     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu must divide each rank's mini-batch, ppo_mini_batch_size "
     "x rollout.n / ranks = 8 x 8 / 2 sequences (got 64; verl would stop at the first update)"),
])  # fmt: skip
def test_batch_sizes_verl_refuses_at_the_first_update_are_named(overrides, said, monkeypatch, tmp_path):
    """The off-policy regime's first try (compare --mini-batches 4 before it set the micro-batch) passed every check
    and stopped at its first update; config_problem names the combination, and the fitting ones pass."""
    from stare_verl.jobs.recipes import config_problem

    monkeypatch.chdir(tmp_path)
    assert config_problem(compose_recipe("cpu/shortcot_tiny_stare", [*PLACEHOLDERS, *overrides])) == said
    for fits in (["actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"],
                 ["actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"],
                 ["actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.use_dynamic_bsz=true"],
                 ["trainer.n_gpus_per_node=2", "ray_kwargs.ray_init.num_gpus=2",
                  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32"]):  # fmt: skip
        assert config_problem(compose_recipe("cpu/shortcot_tiny_stare", [*PLACEHOLDERS, *fits])) is None, fits


def test_config_problem_joins_problems_and_passes_what_verl_allows(monkeypatch, tmp_path):
    from stare_verl.jobs.recipes import config_problem

    monkeypatch.chdir(tmp_path)
    cfg = compose_recipe("cpu/shortcot_tiny_stare", [*PLACEHOLDERS, "actor_rollout_ref.rollout.n=0",
                                                     "actor_rollout_ref.actor.optim.lr=abc"])  # fmt: skip
    assert config_problem(cfg) == ("actor_rollout_ref.actor.optim.lr must be a number in (0, 1] (got 'abc'); "
                                   "actor_rollout_ref.rollout.n must be an integer >= 1 (got 0)")  # fmt: skip
    # null where verl reads it as "not set", greedy rollouts asked for as such, bounds themselves, an int for a float
    ok = ["trainer.total_training_steps=null", "actor_rollout_ref.actor.clip_ratio_low=null",
          "actor_rollout_ref.rollout.temperature=0", "actor_rollout_ref.rollout.do_sample=false",
          "actor_rollout_ref.actor.optim.lr=1", "algorithm.gamma=0", "actor_rollout_ref.rollout.top_k=-1"]  # fmt: skip
    assert config_problem(compose_recipe("cpu/shortcot_tiny_stare", [*PLACEHOLDERS, *ok])) is None
    # a folder here that is no model (no config.json); a model folder; a path missing here (a hub id, a GPU node's)
    (tmp_path / "model").mkdir()
    cfg = compose_recipe("cpu/shortcot_tiny_stare", [*PLACEHOLDERS, f"actor_rollout_ref.model.path={tmp_path}"])
    assert config_problem(cfg) == (f"actor_rollout_ref.model.path must be a model folder with config.json (got "
                                   f"{tmp_path}, a folder without one)")  # fmt: skip
    (tmp_path / "model" / "config.json").write_text("{}")
    for path in (tmp_path / "model", "Qwen/Qwen2.5-Math-7B", tmp_path / "nowhere"):
        cfg = compose_recipe("cpu/shortcot_tiny_stare", [*PLACEHOLDERS, f"actor_rollout_ref.model.path={path}"])
        assert config_problem(cfg) is None, path


@pytest.mark.parametrize(("override", "said"), [
    ("algorithm.stare.reweight_ww=2",  # STARE's section takes its own fields only: the nearest, no "+" advice
     "override 'algorithm.stare.reweight_ww=2': no key algorithm.stare.reweight_ww in this recipe; did you mean "
     "algorithm.stare.reweight_w?"),
    ("actor_rollout_ref.rolout.n=2", "override 'actor_rollout_ref.rolout.n=2': no key actor_rollout_ref.rolout.n in "
                                     "this recipe; did you mean actor_rollout_ref.rollout.n?"),
    ("actor_rollout_ref.actor.optim.lrr=1e-5", "override 'actor_rollout_ref.actor.optim.lrr=1e-5': no key "
     "actor_rollout_ref.actor.optim.lrr in this recipe; did you mean actor_rollout_ref.actor.optim.lr?"),
    ("~algorithm.stare.W", "override '~algorithm.stare.W': no key algorithm.stare.W in this recipe; the keys of "
     "algorithm.stare: adaptive, alpha, chunk_size, epsilon, m_min, norm_adv_by_std_in_grpo, reweight_m, reweight_w, "
     "scope, target_entropy, top_p_ratio, variant, w_max, zero_variance_tol"),
    ("data.max_response_length.x=1", "override 'data.max_response_length.x=1': no key data.max_response_length.x "
     "in this recipe; data.max_response_length holds a value, not keys (a key the recipe does not have is added with "
     "+data.max_response_length.x=1)"),
    ("algorithm.forking.rho=0.2",  # a method's setting the recipe does not list: Hydra's advice is right here
     "override 'algorithm.forking.rho=0.2': algorithm.forking.rho is not in this recipe; add it with "
     "+algorithm.forking.rho=0.2"),
])  # fmt: skip
def test_a_key_the_recipe_does_not_have_names_the_nearest(override, said, monkeypatch, tmp_path):
    """Hydra's own message for a misspelt key is its advice to add it with +, over two lines."""
    from hydra.errors import ConfigCompositionException

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigCompositionException) as err:
        compose_recipe("cpu/shortcot_tiny_stare", [*PLACEHOLDERS, override])
    assert str(err.value) == said
