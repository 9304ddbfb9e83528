"""The tool agent loop on the real SmolLM2-135M-Instruct tokenizer (plain ChatML template, no ``tools`` handling):
token ids stay exactly as the policy generated them across turns, even ids whose decode -> encode round trip
gives other ids; the observation is the template's ``tool`` turn; the tool list reaches the prompt through the
system message. verl's real agent-loop worker, our loop and the real sandboxed ``code_interpreter`` run; the
policy is a scripted server. Skipped when the prepared model folder is absent."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

REAL = Path(os.environ.get("STARE_CACHE_DIR", "/work/main/runs/cache")) / "models" / "smollm2-135m"
pytestmark = pytest.mark.skipif(
    not (REAL / "tokenizer.json").is_file(),
    reason=f"the prepared SmolLM2-135M-Instruct folder is absent ({REAL}; `make model` prepares it)",
)

QUESTION, ANSWER = "What is 12 * 7?", "84"


def _spelled(tok, text: str) -> list[int]:
    """``text`` one character a token: a non-canonical tokenization of the same text."""
    return [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(REAL)


@pytest.fixture(scope="module")
def episode(tok, tmp_path_factory):
    """One scripted two-turn episode (call the tool, answer) through verl's agent-loop worker."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    import envs.tool_use.agent_loop  # noqa: F401  (registers stare_tool_agent)
    from envs.datasets import make_row, write_parquet
    from envs.simulators import ScriptedEpisode, ScriptedLLMServer, ScriptedTurn, tool_call_text
    from envs.tool_use.task import to_tool_use_row
    from tests.support.agent_loop import REPO, RewardHandle, compose_multi_turn_config

    tmp = tmp_path_factory.mktemp("real_ids")
    tool_cfg = yaml.safe_load((REPO / "recipes" / "tool_use" / "tool_config.yaml").read_text())
    tool_cfg_path = tmp / "tool_config.yaml"
    tool_cfg_path.write_text(yaml.safe_dump(tool_cfg))
    cfg = compose_multi_turn_config(str(REAL), str(tool_cfg_path), prompt_length=512, response_length=256,
                                    max_model_len=1024, max_assistant_turns=3,
                                    overrides=["actor_rollout_ref.rollout.calculate_log_probs=true"])
    row = to_tool_use_row(make_row(QUESTION, ANSWER, "test/real", 0, "test", family="tool_use"), system=None)
    parquet = write_parquet([row], tmp / "episodes.parquet")
    dataset = RLHFDataset(data_files=[str(parquet)], tokenizer=tok, config=cfg.data, processor=None)
    batch = DataProto.from_single_dict(collate_fn([dataset[0]]))
    batch.non_tensor_batch["uid"] = np.array(["0"], dtype=object)

    # turn 1: "Let me compute. " spelled one character a token, then the call; turn 2: the answer, spelled
    turn1 = _spelled(tok, "Let me compute. ") + tok.encode(tool_call_text("print(12 * 7)"), add_special_tokens=False)
    turn2 = _spelled(tok, "The answer is \\boxed{84}.")
    server = ScriptedLLMServer(tok, [ScriptedEpisode(QUESTION, [ScriptedTurn(ids=turn1), ScriptedTurn(ids=turn2)])],
                               max_model_len=1024)

    async def go():
        reward_worker = RewardLoopWorker(cfg)
        worker = AgentLoopWorker(cfg, server, reward_loop_worker_handles=[RewardHandle(reward_worker)])
        try:
            return await asyncio.wait_for(worker.generate_sequences(batch), timeout=120)
        finally:
            await worker.tools[0].aclose()

    out = asyncio.run(go())
    prompt_len = out.batch["prompts"].shape[1]
    attn = out.batch["attention_mask"][0]
    n_prompt, n_resp = int(attn[:prompt_len].sum()), int(attn[prompt_len:].sum())
    ids = out.batch["input_ids"][0]
    return {
        "prompt": ids[prompt_len - n_prompt : prompt_len].tolist(),
        "response": ids[prompt_len : prompt_len + n_resp].tolist(),
        "mask": out.batch["response_mask"][0][:n_resp].tolist(),
        "reward": float(out.batch["rm_scores"][0].sum()),
        "nt": {k: v[0] for k, v in out.non_tensor_batch.items()},
        "calls": server.calls_of(0),
        "turns": (turn1 + [tok.eos_token_id], turn2 + [tok.eos_token_id]),
    }


def test_the_scripted_ids_are_not_what_their_text_encodes_to(tok):
    ids = _spelled(tok, "Let me compute. ")
    assert tok.encode(tok.decode(ids), add_special_tokens=False) != ids


def test_sequence_is_prompt_generated_and_observation_tokens_exactly(tok, episode):
    turn1, turn2 = episode["turns"]
    calls = episode["calls"]
    assert len(calls) == 2 and calls[0].output_ids == turn1 and calls[1].output_ids == turn2
    # the observation: the template's tool turn, after the newline ChatML puts behind <|im_end|>
    obs = tok.encode(f"\n<|im_start|>tool\n{ANSWER}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    assert episode["prompt"] == calls[0].prompt_ids
    assert calls[1].prompt_ids == calls[0].prompt_ids + turn1 + obs
    assert episode["prompt"] + episode["response"] == calls[0].prompt_ids + turn1 + obs + turn2
    assert episode["mask"] == [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)
    assert episode["nt"]["response_length"] == len(turn1) + len(turn2)


def test_prompt_offers_the_tool_in_the_system_message(tok, episode):
    from envs.tool_use.tool_prompt import tool_system_prompt
    from envs.tools.schema import CODE_INTERPRETER_SCHEMA_JSON

    expected = tok.apply_chat_template(
        [{"role": "system", "content": tool_system_prompt([CODE_INTERPRETER_SCHEMA_JSON])},
         {"role": "user", "content": QUESTION}], tokenize=True, add_generation_prompt=True, return_dict=False)
    assert episode["prompt"] == list(expected)
    text = tok.decode(episode["prompt"])
    assert text.startswith("<|im_start|>system\nYou can use the following tools:\n<tools>\n")
    assert '"name": "code_interpreter"' in text and "SmolLM" not in text


def test_tool_ran_and_the_answer_scored(episode):
    assert episode["reward"] == 1.0
    assert episode["nt"]["num_tool_executed"] == 1 and episode["nt"]["termination"] == "answer"
