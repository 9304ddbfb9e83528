"""The SFT token layout is exactly what the RL agent loop produces: demonstrations replayed through verl's
agent-loop worker with the project's ``stare_tool_agent`` loop, the real code_interpreter tool and reward,
with the demo tokenizer and model directory (a scripted server stands in for the model)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import envs.tool_use.agent_loop  # noqa: F401  (registers stare_tool_agent)
from envs.datasets import write_parquet
from envs.simulators import ScriptedEpisode, ScriptedLLMServer
from envs.tiny_hf import build_model, build_tokenizer, save_model
from stare_verl.jobs.demo.sft import encode_demo, render_demo
from tests.support import demos as D
from tests.support.agent_loop import REPO, RewardHandle, compose_multi_turn_config

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    tmp = tmp_path_factory.mktemp("demo_agent_loop")
    demos, _ = D.build_demos(D.sample_problems(6, seed=31))
    tok = build_tokenizer([render_demo(d) for d in demos], tmp / "model")
    save_model(build_model(tok, seed=0), tok, tmp / "model")
    rows = [D.problem_row(d.problem, "test", i) for i, d in enumerate(demos)]
    parquet = write_parquet(rows, tmp / "rows.parquet")
    cfg = compose_multi_turn_config(
        str(tmp / "model"),
        str(REPO / "recipes" / "tool_use" / "tool_config.yaml"),
        prompt_length=128,
        response_length=128,
        max_model_len=256,
        max_assistant_turns=3,
    )
    dataset = RLHFDataset(data_files=[str(parquet)], tokenizer=tok, config=cfg.data, processor=None)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    batch.non_tensor_batch["uid"] = np.array([str(i) for i in range(len(demos))], dtype=object)
    server = ScriptedLLMServer(tok, [ScriptedEpisode(d.problem.question, d.assistant_texts()) for d in demos],
                               max_model_len=256)

    async def go():
        reward_worker = RewardLoopWorker(cfg)
        worker = AgentLoopWorker(cfg, server, reward_loop_worker_handles=[RewardHandle(reward_worker)])
        try:
            return await asyncio.wait_for(worker.generate_sequences(batch), timeout=120)
        finally:
            await worker.tools[0].aclose()

    return demos, tok, asyncio.run(go())


def test_agent_loop_tokens_equal_sft_tokens(replay):
    demos, tok, out = replay
    prompt_len = out.batch["prompts"].shape[1]
    for i, d in enumerate(demos):
        attn = out.batch["attention_mask"][i]
        n_prompt, n_resp = int(attn[:prompt_len].sum()), int(attn[prompt_len:].sum())
        ids = out.batch["input_ids"][i]
        prompt = ids[prompt_len - n_prompt : prompt_len].tolist()
        response = ids[prompt_len : prompt_len + n_resp].tolist()
        mask = out.batch["response_mask"][i][:n_resp].tolist()
        sft_ids, sft_mask = encode_demo(d, tok)
        assert prompt + response == sft_ids, (tok.decode(prompt + response), tok.decode(sft_ids))
        assert sft_mask[: len(prompt)] == [0] * len(prompt)
        assert mask == sft_mask[len(prompt) :]  # loss mask of SFT == response_mask of RL


def test_agent_loop_rewards_the_demonstrations(replay):
    demos, _, out = replay
    rewards = out.batch["rm_scores"].sum(-1).tolist()
    assert rewards == [1.0] * len(demos)
    assert list(out.non_tensor_batch["num_tool_executed"]) == [1] * len(demos)
    assert [str(x) for x in out.non_tensor_batch["model_response_text"]] == [
        f"\\boxed{{{d.problem.answer}}}" for d in demos
    ]
