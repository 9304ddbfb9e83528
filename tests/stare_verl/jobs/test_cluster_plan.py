"""How a run joins an existing Ray cluster (``RAY_ADDRESS``) and what the multi-node plan prints
(``stare_verl.jobs.cluster``); no Ray is started here."""

from __future__ import annotations

import argparse
import shlex

import pytest

from stare_verl.jobs.cluster import (
    LocalCluster,
    cluster_overrides,
    cluster_plan,
    driver_argv,
    join_cluster,
    lost_node_message,
    shell_join,
)


def test_no_ray_address_leaves_the_command_alone():
    cmd = ["py", "-m", "verl.trainer.main_ppo", "a=1"]
    assert cluster_overrides({}) == [] and cluster_overrides({"RAY_ADDRESS": " "}) == []
    assert join_cluster(cmd, {"PATH": "/bin"}) == cmd


def test_joining_a_cluster_drops_local_ray_keys_and_ships_the_run_env():
    env = {"RAY_ADDRESS": "10.0.0.1:6379", "VERL_PLATFORM": "cpu", "VERL_FILE_LOGGER_PATH": "/r/logs/a,b=c.jsonl",
           "HOME": "/root"}  # fmt: skip
    cmd = ["py", "-m", "verl.trainer.main_ppo", "ray_kwargs.ray_init.num_cpus=4", "+ray_kwargs.ray_init.num_gpus=2",
           "trainer.nnodes=2"]  # fmt: skip
    out = join_cluster(cmd, env)
    assert out[:4] == ["py", "-m", "verl.trainer.main_ppo", "trainer.nnodes=2"]
    assert out[4:] == [
        "++ray_kwargs.ray_init.num_cpus=null",
        "++ray_kwargs.ray_init.num_gpus=null",
        "++ray_kwargs.ray_init.include_dashboard=null",
        "++ray_kwargs.ray_init.address='10.0.0.1:6379'",
        "++ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM='cpu'",
        "++ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH='/r/logs/a,b=c.jsonl'",
    ]  # HOME is not a run variable: the nodes keep their own


@pytest.mark.parametrize("recipe", ["cpu/tooluse_tiny_stare", "shortcot_qwen2.5-math-7b_stare"])
def test_cluster_overrides_compose_on_the_cpu_and_gpu_recipes(recipe):
    """verl reads ``ray_kwargs.ray_init`` whole into ``ray.init``: the address set, the local keys null (Ray's
    defaults; it refuses num_cpus / num_gpus when it connects), the variables in the job's runtime_env."""
    from stare_verl.jobs.recipes import compose_recipe

    env = {"RAY_ADDRESS": "127.0.0.1:6379", "VERL_PLATFORM": "cpu", "VERL_FILE_LOGGER_PATH": "/r/a,b=c.jsonl"}
    cfg = compose_recipe(recipe, ["trainer.nnodes=2", *cluster_overrides(env)])
    init = cfg.ray_kwargs.ray_init
    assert init.address == "127.0.0.1:6379" and init.num_cpus is None and init.num_gpus is None
    assert dict(init.runtime_env.env_vars) == {"VERL_PLATFORM": "cpu", "VERL_FILE_LOGGER_PATH": "/r/a,b=c.jsonl"}
    assert cfg.trainer.nnodes == 2


def test_shell_join_leaves_head_ip_to_the_shell():
    assert shell_join(["ray", "start", "--address=$HEAD_IP:6379"]) == "ray start --address=$HEAD_IP:6379"
    assert shell_join(["echo", "a b", "$HOME"]) == "echo 'a b' '$HOME'"
    assert shlex.split(shell_join(["x", "--runtime-env-json={\"a\": 1}"])) == ["x", "--runtime-env-json={\"a\": 1}"]


def test_cluster_plan_commands_and_errors():
    main = ["/venv/bin/python", "-m", "verl.trainer.main_ppo", "--config-name=r", "trainer.nnodes=3"]
    plan = cluster_plan(main, ["stare-verl", "train", "--gpu"], 3, 8, {"PYTHONUNBUFFERED": "1", "PYTHONPATH": "/x"},
                        "")  # fmt: skip
    assert plan.head[:3] == ["ray", "start", "--head"] and "--num-gpus=8" in plan.head
    assert plan.worker == ["ray", "start", "--address=$HEAD_IP:6379", "--num-gpus=8"]
    assert plan.submit[-5:] == ["python", "-m", "verl.trainer.main_ppo", "--config-name=r", "trainer.nnodes=3"]
    assert plan.submit[4] == '--runtime-env-json={"env_vars": {"PYTHONUNBUFFERED": "1"}}'
    assert plan.direct == ["env", "RAY_ADDRESS=$HEAD_IP:6379", "stare-verl", "train", "--gpu"]
    lines = plan.lines(3)
    assert "  on each of the 2 worker node(s), once the head is up:" in lines
    assert "    ray start --address=$HEAD_IP:6379 --num-gpus=8" in lines
    for bad in ((0, 8), (2, 0)):
        with pytest.raises(ValueError, match="must be >= 1"):
            cluster_plan(main, [], *bad, {}, "")


def test_driver_argv_keeps_the_given_gpu_options_and_overrides():
    defaults = argparse.Namespace(family="tooluse", method="stare", seed=0, steps=None, save_freq=0, n_gpus=None,
                                  nnodes=None, logger=None, run_dir=None, gpu_recipe=None)  # fmt: skip
    args = argparse.Namespace(**{**vars(defaults), "seed": 2, "nnodes": 2, "logger": ["console", "wandb"],
                                 "overrides": ["a.b=1"], "dry_run": True})  # fmt: skip
    assert driver_argv(args, defaults) == ["stare-verl", "train", "--gpu", "--family", "tooluse", "--seed", "2",
                                           "--nnodes", "2", "--logger", "console,wandb", "a.b=1"]  # fmt: skip


def test_a_lost_actor_on_a_cluster_is_named_with_the_way_back():
    log = "...\nray.exceptions.ActorUnavailableError: The actor e269 is unavailable: RpcError: Socket closed\n"
    line = lost_node_message(log, {"RAY_ADDRESS": "10.0.0.1:6379"})
    assert line.startswith("error: the run lost a process on the Ray cluster at 10.0.0.1:6379 "
                           "(ActorUnavailableError): a node died or was cut off")  # fmt: skip
    assert "resumes from the last checkpoint" in line
    assert lost_node_message(log, {}) is None  # one machine: verl's own error stands
    assert lost_node_message("ValueError: bad config\n", {"RAY_ADDRESS": "h:1"}) is None


def test_local_cluster_refuses_a_bad_gpu_list_before_starting_anything():
    for bad in ([1], [1, -1], [1, 0, 0]):
        cluster = LocalCluster(n_nodes=2, gpus_per_node=bad)
        with pytest.raises(ValueError, match="gpus_per_node needs 2 counts >= 0"):
            cluster.start()
        assert cluster.nodes == [] and cluster.temp_dir is None


def test_local_cluster_nodes_wait_longer_for_their_raylet_unless_told():
    """`ray start` of the head timed out ("Try increase the RAY_raylet_start_wait_time_s config") on the loaded 2-core
    host: the nodes get the CPU run's wait; a value in the cluster's env wins."""
    from stare_verl.jobs.cluster import LocalCluster
    from stare_verl.jobs.train.launch import RAY_START_WAIT_S

    assert LocalCluster(n_nodes=2)._env()["RAY_raylet_start_wait_time_s"] == str(RAY_START_WAIT_S)
    own = LocalCluster(n_nodes=2, env={"RAY_raylet_start_wait_time_s": "42"})._env()
    assert own["RAY_raylet_start_wait_time_s"] == "42"
