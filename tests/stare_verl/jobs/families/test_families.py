"""The family descriptors (issue 28): the built-ins say what the jobs used to spell out in ``if``s, the recipes
they name exist and agree with them, and the envs row builder makes the rows the demo and the datasets wrote."""

from __future__ import annotations

import pytest

from envs.contract import AGENT_NAME, FAMILIES
from envs.families import env_families, env_family, is_tool_family, row_env_family
from envs.tool_use import TOOL_USE_SYSTEM
from stare_verl.jobs.families import DEFAULT_FAMILY, job_families, job_family, job_family_names
from stare_verl.recipe_files import recipes_dir

BUILTIN = ("tooluse", "shortcot", "longcot")


def test_builtin_descriptors_hold_what_the_jobs_spelled_out():
    assert job_family_names()[:3] == BUILTIN and DEFAULT_FAMILY == "tooluse"
    assert tuple(f.name for f in env_families())[:3] == FAMILIES
    assert all(job_family(n).env is env_family(n) and job_family(n).name == n for n in BUILTIN)
    assert {n: job_family(n).aliases for n in BUILTIN} == {"tooluse": ("tool_use",), "shortcot": ("short_cot",),
                                                           "longcot": ("long_cot",)}
    assert [job_family(a).name for a in ("tool_use", "short_cot", "long_cot")] == list(BUILTIN)  # the old spelling
    assert [env_family(n).think for n in BUILTIN] == ["auto", "auto", "required"]
    assert {n: job_family(n).min_sft_accuracy for n in BUILTIN} == {"tooluse": 0.5, "shortcot": 0.4, "longcot": 0.4}
    assert {n: job_family(n).gpu_recipe for n in BUILTIN} == {
        "tooluse": "tooluse_qwen2.5-7b-sft", "shortcot": "shortcot_qwen2.5-math-7b",
        "longcot": "longcot_r1-distill-qwen-1.5b"}  # fmt: skip
    assert {n: (job_family(n).compare_steps, job_family(n).compare_seeds, job_family(n).compare_dir)
            for n in BUILTIN} == {"tooluse": (30, (0, 1, 2), "compare"), "shortcot": (100, (0, 1), "compare-shortcot"),
                                  "longcot": (30, (0, 1, 2), "compare-longcot")}  # fmt: skip
    assert [job_family(n).multi_turn for n in BUILTIN] == [True, False, False]
    assert [job_family(n).eval_turns(5) for n in BUILTIN] == [5, 1, 1]
    assert [job_family(n).demos_per_problem for n in BUILTIN] == [1, 4, 4]
    assert [job_family(n).legacy_sft_key for n in BUILTIN] == [True, False, False]
    assert dict(job_family("tooluse").sft_defaults) == {"model": {"num_hidden_layers": 2}, "vocab_size": 484,
                                                        "digits_per_token": 2, "steps": 1300, "anneal_below_loss": 0.1}
    assert dict(job_family("shortcot").sft_defaults) == {"steps": 1000, "max_response_tokens": 48}
    assert dict(job_family("longcot").sft_defaults) == {"steps": 800, "max_response_tokens": 128}
    assert job_family("tooluse").accepts_expression("1 - 2")  # tool use takes every question
    assert job_family("shortcot").accepts_expression("4 + 7 + 3")
    assert not job_family("longcot").accepts_expression("4 - 1")
    with pytest.raises(ValueError, match="unknown family"):
        job_family("cot")


def test_the_task_table_is_envs_tool_use_offline_mix():
    from envs.tool_use.task import OFFLINE_TOOL_TASKS

    assert {k: dict(v) for k, v in job_family("tooluse").task_table.items()} == dict(OFFLINE_TOOL_TASKS)


@pytest.mark.parametrize("name", BUILTIN)
def test_recipes_named_by_the_descriptor_exist_and_agree_with_the_env_family(name):
    fam = job_family(name)
    for method in ("stare", "grpo"):
        assert (recipes_dir() / "cpu" / f"{fam.cpu_recipe}_{method}.yaml").is_file()
        assert (recipes_dir() / f"{fam.gpu_recipe}_{method}.yaml").is_file()
    assert (fam.tool_config is not None) == fam.env.tool_use
    if fam.tool_config:
        assert (recipes_dir() / fam.tool_config).is_file()
    from stare_verl.jobs.recipes import compose_recipe

    fill = ["actor_rollout_ref.model.path=x", "data.train_files=x", "data.val_files=x", "trainer.default_local_dir=x"]
    cfg = compose_recipe(f"cpu/{fam.cpu_recipe}_stare", fill)
    reward = cfg.reward.custom_reward_function
    assert reward.path == f"pkg://{fam.env.reward_module}" and reward.name == fam.env.reward_function
    assert (reward.get("reward_kwargs") or {}).get("family", fam.name) == fam.name  # tool use: the reward's default
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == fam.env.agent_name


def test_env_rows_and_lookups():
    tool, short = env_family("tool_use"), env_family("short_cot")
    row = {"data_source": "rg/x", "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
           "reward_model": {"ground_truth": "1"}, "extra_info": {"index": 0}}
    t = tool.make_row(row)
    assert t["prompt"] == [{"role": "system", "content": TOOL_USE_SYSTEM}, {"role": "user", "content": "q"}]
    assert t["agent_name"] == AGENT_NAME and t["extra_info"]["need_tools_kwargs"] is True
    assert t["extra_info"]["tools_kwargs"] == {"code_interpreter": {"create_kwargs": {"data_source": "rg/x"}}}
    assert tool.make_row(row, system=None)["prompt"] == [{"role": "user", "content": "q"}]
    c = short.make_row(row)
    assert c["prompt"] == row["prompt"] and c["agent_name"] == "single_turn_agent"
    assert c["extra_info"] == {"index": 0, "family": "shortcot"} and row["extra_info"] == {"index": 0}
    with pytest.raises(ValueError, match="user message"):
        tool.make_row({"prompt": [{"role": "system", "content": "s"}]})
    assert is_tool_family("tool_use") and not is_tool_family("long_cot") and not is_tool_family(None)
    assert row_env_family("long_cot", False).name == "longcot" and row_env_family(None, False) is short
    assert row_env_family("long_cot", True) is tool and row_env_family("tool_use", False) is short
    assert [f.name for f in job_families()][:3] == list(BUILTIN)
    assert is_tool_family("tooluse") and row_env_family("longcot", True) is tool
