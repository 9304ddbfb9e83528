"""Routing-independent seeds of the ``hf`` rollout: the derivation, the two verl patches that carry a row's seed
from the trainer to the request, and the engine drawing the same samples whichever replica serves a request."""

from __future__ import annotations

import asyncio
import types

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import stare_verl.cpu.verl_compat as verl_compat
from stare_verl.cpu.rollout_seeds import SEED_KEY, request_stream_seed, row_seeds, session_seed

# ---------------------------------------------------------------------------------------------------- derivation


def test_row_seeds_are_distinct_per_row_step_kind_submission_and_base_seed():
    base = row_seeds(42, 3, False, 0, 64)
    assert len(set(base)) == 64
    assert all(isinstance(s, int) and 0 <= s < 2**63 for s in base)
    assert row_seeds(42, 3, False, 0, 64) == base  # same inputs, same seeds (no per-process hash salt)
    assert row_seeds(42, 3, False, 0, 10) == base[:10]  # a row's seed does not depend on the batch size
    others = [
        row_seeds(42, 4, False, 0, 64),  # next step
        row_seeds(42, 3, True, 0, 64),  # validation at the same step
        row_seeds(42, 3, False, 1, 64),  # second batch of the step
        row_seeds(43, 3, False, 0, 64),  # other rollout.seed
    ]
    for other in others:
        assert not set(other) & set(base)
    assert row_seeds(1, 2, False, 0, 0) == []
    with pytest.raises(ValueError, match="n_rows"):
        row_seeds(1, 2, False, 0, -1)


def test_session_and_request_seeds():
    rows = row_seeds(7, 1, False, 0, 4)
    sessions = [session_seed(r, s) for r in rows for s in range(8)]
    assert len(set(sessions)) == 32 and not set(sessions) & set(rows)
    assert session_seed(rows[0], 3) == session_seed(rows[0], 3)
    prompt = [5, 6, 7]
    # turns of one session: same seed, longer prompts -> distinct streams; the same turn -> the same stream
    turn1 = request_stream_seed(sessions[0], prompt)
    turn2 = request_stream_seed(sessions[0], prompt + [9, 10])
    assert turn1 != turn2
    assert request_stream_seed(sessions[0], list(prompt)) == turn1
    assert request_stream_seed(sessions[1], prompt) != turn1
    # token ids are encoded with their length: [1, 23] and [12, 3] must not collide
    assert request_stream_seed(0, [1, 23]) != request_stream_seed(0, [12, 3])
    assert 0 <= turn1 < 2**63


# ---------------------------------------------------------------------------------------------------- verl patches


def _manager(name="hf", seed=42):
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": name, "seed": seed}}})
    return types.SimpleNamespace(config=config)


def _batch(n, steps=1, validate=None):
    from verl.utils import tensordict_utils as tu

    uids = np.array([f"u{i}" for i in range(n)], dtype=object)
    batch = tu.get_tensordict({"input_ids": torch.arange(n * 3).view(n, 3), "uid": uids})
    tu.assign_non_tensor_data(batch, "global_steps", steps)
    if validate is not None:
        tu.assign_non_tensor_data(batch, "validate", validate)
    return batch


def test_add_row_seeds_adds_a_column_to_a_copy_and_counts_submissions():
    manager = _manager()
    batch = _batch(6, steps=5)
    first = verl_compat.add_row_seeds(manager, batch, "hf")
    assert SEED_KEY not in batch.keys() and SEED_KEY in first.keys()
    assert first[SEED_KEY].dtype == torch.int64
    assert first[SEED_KEY].tolist() == row_seeds(42, 5, False, 0, 6)
    assert torch.equal(first["input_ids"], batch["input_ids"])
    # a second batch of the same step (async warm-up, several validation batches) gets new seeds
    second = verl_compat.add_row_seeds(manager, _batch(6, steps=5), "hf")
    assert second[SEED_KEY].tolist() == row_seeds(42, 5, False, 1, 6)
    val = verl_compat.add_row_seeds(manager, _batch(6, steps=5, validate=True), "hf")
    assert val[SEED_KEY].tolist() == row_seeds(42, 5, True, 0, 6)
    # another trainer (a new manager) counts from 0 again: the seeds are the same
    again = verl_compat.add_row_seeds(_manager(), _batch(6, steps=5), "hf")
    assert torch.equal(again[SEED_KEY], first[SEED_KEY])
    # chunks (one per agent-loop worker) keep each row's seed, whatever the number of workers
    for workers in (1, 2, 3):
        rejoined = torch.cat([c[SEED_KEY] for c in first.chunk(workers)])
        assert torch.equal(rejoined, first[SEED_KEY])


def test_add_row_seeds_leaves_other_rollouts_and_batches_without_a_step_alone():
    batch = _batch(3)
    assert verl_compat.add_row_seeds(_manager(name="vllm"), batch, "hf") is batch
    from verl.utils import tensordict_utils as tu

    no_step = tu.get_tensordict({"input_ids": torch.zeros(2, 3)})
    assert verl_compat.add_row_seeds(_manager(), no_step, "hf") is no_step


def test_seeded_sampling_params_per_session():
    params = {"temperature": 1.0, "top_p": 1.0}
    kwargs = {SEED_KEY: torch.tensor(123), "session_id": 2, "uid": "u0"}
    out = verl_compat.seeded_sampling_params(params, {"rollout_n": 0}, kwargs)
    assert out == {"temperature": 1.0, "top_p": 1.0, "seed": session_seed(123, 2)}
    assert params == {"temperature": 1.0, "top_p": 1.0}  # the dict shared by a row's sessions is not touched
    # the column never reaches the agent loop or TransferQueue
    assert kwargs == {"session_id": 2, "uid": "u0"}
    # without session_id (verl's non-TransferQueue worker repeats rows instead): the trajectory's rollout_n
    out = verl_compat.seeded_sampling_params(params, {"rollout_n": 1}, {SEED_KEY: 5})
    assert out["seed"] == session_seed(5, 1)
    plain = {"uid": "u0"}
    assert verl_compat.seeded_sampling_params(params, {}, plain) is params and plain == {"uid": "u0"}


def test_patches_wrap_the_manager_and_the_worker():
    """The two wrappers, on stand-ins of verl's classes: the manager hands the workers the seeded copy, the worker's
    agent loop gets the session seed and the row's other fields only."""
    handed = []

    class Manager:
        def __init__(self):
            self.config = _manager().config

        def generate_sequences(self, prompts):
            handed.append(prompts)

    calls = []

    class Worker:
        async def _run_agent_loop(self, sampling_params, trajectory, *, agent_name, trace=True, **kwargs):
            calls.append((sampling_params, trajectory, agent_name, trace, kwargs))
            return "done"

    verl_compat._patch_agent_loop_manager("hf")(types.SimpleNamespace(AgentLoopManagerTQ=Manager))
    verl_compat._patch_agent_loop_worker(types.SimpleNamespace(AgentLoopWorker=Worker))
    patched_once = Manager.generate_sequences, Worker._run_agent_loop
    verl_compat._patch_agent_loop_manager("hf")(types.SimpleNamespace(AgentLoopManagerTQ=Manager))
    verl_compat._patch_agent_loop_worker(types.SimpleNamespace(AgentLoopWorker=Worker))
    assert (Manager.generate_sequences, Worker._run_agent_loop) == patched_once  # idempotent

    Manager().generate_sequences(_batch(4, steps=2))
    seeds = handed[0][SEED_KEY].tolist()
    assert seeds == row_seeds(42, 2, False, 0, 4)
    row = {SEED_KEY: handed[0][SEED_KEY][3], "uid": "u3"}
    worker = Worker()
    out = asyncio.run(
        worker._run_agent_loop(
            {"temperature": 1.0}, {"rollout_n": 0}, agent_name="a", trace=False, session_id=1, **row
        )
    )
    assert out == "done"
    assert calls == [({"temperature": 1.0, "seed": session_seed(seeds[3], 1)}, {"rollout_n": 0}, "a", False,
                      {"session_id": 1, "uid": "u3"})]  # fmt: skip


# ---------------------------------------------------------------------------------------------------- the engine


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from stare_verl.cpu.hf_server import load_model
    from tests.support.cpu import build_tiny_model

    return load_model(build_tiny_model(tmp_path_factory.mktemp("tiny_seeds")))


# rows 4-7 repeat the prompts of rows 0-3
PROMPTS = [[5 + i, 40 + (7 * i) % 60, 20 + i, 100 + i] * (1 + i % 3) for i in range(4)] * 2
SAMPLING = dict(temperature=1.0, top_p=0.95, top_k=50, max_tokens=10, ignore_eos=True, logprobs=True)


def _serve(engines, routing, requests):
    """Submit ``requests`` ((prompt, params) pairs), request ``i`` to ``engines[routing[i]]``, all at once; return
    the token ids in request order."""
    futures = [engines[routing[i]].submit(p, s) for i, (p, s) in enumerate(requests)]
    return [f.result(timeout=300).token_ids for f in futures]


@pytest.mark.integration
def test_seeded_requests_give_the_same_samples_however_they_are_routed(tiny_model):
    """One step's requests (8 rows x 2 sessions) served by one engine, or spread over two replicas (different replica
    seeds, different orders and batch neighbours): with per-row seeds every request draws the same tokens; without
    (the fallback) the samples depend on the routing."""
    from stare_verl.cpu.hf_server import GenerationEngine, SamplingParams

    def engines(n):
        return [GenerationEngine(tiny_model, [], max_model_len=128, max_batch_size=6, seed=7 + 1_000_003 * r)
                for r in range(n)]  # fmt: skip

    seeds = row_seeds(42, 1, False, 0, len(PROMPTS))
    order = [(row, s) for row in range(len(PROMPTS)) for s in range(2)]

    def requests(seeded):
        return [
            (PROMPTS[row], SamplingParams(**SAMPLING, seed=session_seed(seeds[row], s) if seeded else None))
            for row, s in order
        ]

    results = {}
    for seeded in (True, False):
        one, two = engines(1), engines(2)
        reqs = requests(seeded)
        alone = _serve(one, [0] * len(reqs), reqs)
        # reversed order, alternating replicas: each request meets other neighbours on another engine
        rev = list(reversed(range(len(reqs))))
        spread_rev = _serve(two, [i % 2 for i in range(len(reqs))], [reqs[i] for i in rev])
        spread = [None] * len(reqs)
        for k, i in enumerate(rev):
            spread[i] = spread_rev[k]
        for e in one + two:
            e.shutdown()
        results[seeded] = (alone, spread)

    alone, spread = results[True]
    assert spread == alone
    assert all(len(t) == 10 for t in alone)
    # rows 4-7 repeat the prompts of rows 0-3, and the two sessions of a row share a prompt: all draw apart
    assert len({tuple(t) for t in alone}) == len(alone)
    fallback_alone, fallback_spread = results[False]
    assert fallback_spread != fallback_alone


@pytest.mark.integration
def test_turns_of_one_session_draw_from_distinct_streams(tiny_model):
    """The tool agent loop sends every turn of a session with the session's seed and the grown prompt: a turn's
    draws equal those of the same turn sent alone, and differ from reusing the first turn's stream."""
    from stare_verl.cpu.hf_server import GenerationEngine, SamplingParams, stream_uniform

    engine = GenerationEngine(tiny_model, [], max_model_len=128, seed=0)
    params = SamplingParams(**SAMPLING, seed=session_seed(99, 0))
    first = engine.submit(PROMPTS[0], params).result(timeout=300).token_ids
    second_prompt = PROMPTS[0] + first + [11, 12, 13]  # prompt + reply + tool output
    second = engine.submit(second_prompt, params).result(timeout=300).token_ids
    other = GenerationEngine(tiny_model, [], max_model_len=128, seed=5)
    assert other.submit(second_prompt, params).result(timeout=300).token_ids == second
    engine.shutdown()
    other.shutdown()
    s1, s2 = request_stream_seed(params.seed, PROMPTS[0]), request_stream_seed(params.seed, second_prompt)
    assert s1 != s2
    assert [stream_uniform(s1, i) for i in range(10)] != [stream_uniform(s2, i) for i in range(10)]
