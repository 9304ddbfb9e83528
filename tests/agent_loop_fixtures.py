"""Helpers for the tests that run verl's real agent-loop worker in-process (no Ray): the PPO config and a
stand-in for the reward loop worker's actor handle."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class RewardHandle:
    """Stands in for a Ray actor handle of verl's RewardLoopWorker: ``compute_score.remote(data)``."""

    def __init__(self, worker):
        self.compute_score = type("M", (), {"remote": staticmethod(worker.compute_score)})


def compose_multi_turn_config(
    model_path: str,
    tool_config: str,
    *,
    prompt_length: int,
    response_length: int,
    max_model_len: int,
    max_assistant_turns: int,
    overrides: Sequence[str] = (),
):
    """verl's ``ppo_trainer`` config for multi-turn tool use with ``envs.tool_use.task.compute_score`` as reward.

    The rollout is named vllm (the agent loop only needs a rollout config; no server is started);
    ``overrides`` are further Hydra overrides.
    """
    import verl
    from hydra import compose, initialize_config_dir

    cfg_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=cfg_dir, version_base=None):
        return compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_path}",
                "actor_rollout_ref.rollout.name=vllm",
                f"actor_rollout_ref.rollout.prompt_length={prompt_length}",
                f"actor_rollout_ref.rollout.response_length={response_length}",
                f"actor_rollout_ref.rollout.max_model_len={max_model_len}",
                "actor_rollout_ref.rollout.multi_turn.enable=true",
                f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={max_assistant_turns}",
                f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
                f"reward.custom_reward_function.path={REPO / 'envs' / 'tool_use' / 'task.py'}",
                "reward.custom_reward_function.name=compute_score",
                f"data.max_prompt_length={prompt_length}",
                *overrides,
            ],
        )
