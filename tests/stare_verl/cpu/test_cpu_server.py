"""The ``hf`` generation server alone (no Ray): batching, sampling parameters, abort, weights, seeds."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

pytestmark = pytest.mark.integration

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from stare_verl.cpu.hf_server import HFGenerationServer, SamplingParams  # noqa: E402
from tests.support.cpu import build_tiny_model  # noqa: E402

PROMPTS = [[5 + i, 40 + (7 * i) % 60, 20 + i, 100 + i] * (1 + i % 3) for i in range(8)]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny_server"))


def make_server(model_path, seed=7, **hf):
    from verl.workers.config import HFModelConfig, RolloutConfig

    config = RolloutConfig(
        name="hf",
        tensor_model_parallel_size=1,
        prompt_length=64,
        response_length=32,
        seed=seed,
        engine_kwargs={"hf": hf},
    )
    server = HFGenerationServer(config, HFModelConfig(path=model_path), replica_rank=0)
    return server


def run(coro):
    return asyncio.run(coro)


async def _launch(server):
    await server.launch()
    return server


async def _generate_in_background(server, prompt, params, request_id, steps):
    """Start ``server.generate`` as a task; return it once the engine has run ``steps`` decoding steps (or the
    task has ended early, which the caller's assertions then show)."""
    task = asyncio.create_task(server.generate(prompt, params, request_id))
    while server.engine.steps_run < steps and not task.done():
        await asyncio.sleep(0.005)
    return task


GREEDY = {"temperature": 0, "top_p": 1.0, "top_k": -1, "logprobs": True, "max_tokens": 24, "ignore_eos": True}


def test_batched_equals_one_by_one_under_greedy(model_path):
    async def main():
        server = await _launch(make_server(model_path))
        before = server.engine.steps_run
        batched = await asyncio.gather(
            *[server.generate(p, dict(GREEDY), f"b{i}") for i, p in enumerate(PROMPTS)]
        )
        batched_passes = server.engine.steps_run - before
        single = [await server.generate(p, dict(GREEDY), f"s{i}") for i, p in enumerate(PROMPTS)]
        await server.shutdown()
        return batched, single, batched_passes

    batched, single, batched_passes = run(main())
    assert [o.token_ids for o in batched] == [o.token_ids for o in single]
    assert all(len(o.token_ids) == 24 for o in batched)
    for a, b in zip(batched, single, strict=True):
        assert max(abs(x - y) for x, y in zip(a.log_probs, b.log_probs, strict=True)) < 1e-4
    # requests were decoded together: far fewer forward passes than 8 x 24
    assert batched_passes < 3 * 24


def test_request_joins_running_batch(model_path):
    """A short request arriving mid-generation finishes long before the running long one."""

    async def main():
        server = await _launch(make_server(model_path))
        long_params = dict(GREEDY, max_tokens=30)
        long_task = await _generate_in_background(server, PROMPTS[0], long_params, "long", steps=3)
        short = await server.generate(PROMPTS[1], dict(GREEDY, max_tokens=2), "short")
        long_done_when_short_returned = long_task.done()
        long = await long_task
        await server.shutdown()
        return short, long, long_done_when_short_returned

    short, long, long_done = run(main())
    assert len(short.token_ids) == 2 and short.stop_reason == "completed"
    assert not long_done
    assert len(long.token_ids) == 30


def test_stop_token_ids_stop_and_are_included(model_path):
    async def main():
        server = await _launch(make_server(model_path))
        free = await server.generate(PROMPTS[2], dict(GREEDY), "free")
        stop_id = free.token_ids[5]
        stopped = await server.generate(PROMPTS[2], dict(GREEDY, stop_token_ids=[stop_id]), "stop")
        await server.shutdown()
        return free, stopped, stop_id

    free, stopped, stop_id = run(main())
    first = free.token_ids.index(stop_id)
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert stopped.token_ids[-1] == stop_id
    assert stopped.stop_reason == "completed"


def test_topk_minus_one_and_topp_one_mean_no_truncation(model_path):
    """Processed log-probs with top_k=-1, top_p=1, T=1 equal the model's full log-softmax."""

    async def main():
        server = await _launch(make_server(model_path))
        params = {
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": -1,
            "logprobs": True,
            "max_tokens": 16,
            "ignore_eos": True,
        }
        full = await server.generate(PROMPTS[3], dict(params), "full")
        topk = await server.generate(PROMPTS[3], dict(params, top_k=3), "k3")
        topp = await server.generate(PROMPTS[3], dict(params, top_p=0.05), "p")
        model = server.engine.model
        await server.shutdown()
        return full, topk, topp, model

    full, topk, topp, model = run(main())

    def reference(tokens):
        ids = torch.tensor([PROMPTS[3] + tokens])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].float(), -1)
        n = len(PROMPTS[3])
        return [float(logp[n - 1 + i, t]) for i, t in enumerate(tokens)]

    ref = reference(full.token_ids)
    assert max(abs(a - b) for a, b in zip(full.log_probs, ref, strict=True)) < 1e-4
    # truncation renormalises over the kept tokens: processed log-probs rise above the full ones
    ref_k = reference(topk.token_ids)
    assert sum(a - b for a, b in zip(topk.log_probs, ref_k, strict=True)) > 0.1
    assert all(a >= b - 1e-5 for a, b in zip(topk.log_probs, ref_k, strict=True))
    ref_p = reference(topp.token_ids)
    assert sum(a - b for a, b in zip(topp.log_probs, ref_p, strict=True)) > 0.1


def test_abort_returns_partial_tokens_and_resume(model_path):
    async def main():
        server = await _launch(make_server(model_path))
        task = await _generate_in_background(server, PROMPTS[0], dict(GREEDY, max_tokens=400), "a", steps=4)
        await server.abort_all_requests()
        aborted = await task
        # a request arriving while paused waits for resume_generation
        waiting = asyncio.create_task(server.generate(PROMPTS[1], dict(GREEDY, max_tokens=3), "w"))
        await asyncio.sleep(0.2)
        waited = not waiting.done()
        await server.resume_generation()
        resumed = await waiting
        # reject mode: arrivals return at once, aborted, without tokens
        await server.abort_all_requests(reject_request=True)
        rejected = await server.generate(PROMPTS[1], dict(GREEDY, max_tokens=3), "r")
        await server.resume_generation()
        await server.shutdown()
        return aborted, waited, resumed, rejected

    aborted, waited, resumed, rejected = run(main())
    assert aborted.stop_reason == "aborted"
    assert 0 < len(aborted.token_ids) < 400
    assert len(aborted.log_probs) == len(aborted.token_ids)
    assert waited and resumed.stop_reason == "completed" and len(resumed.token_ids) == 3
    assert rejected.stop_reason == "aborted" and rejected.token_ids == []


def test_seeded_sampling_is_deterministic_and_global_steps_reported(model_path):
    params = {"temperature": 1.0, "top_p": 0.9, "top_k": 50, "logprobs": True, "max_tokens": 12}

    async def sample(seed):
        server = await _launch(make_server(model_path, seed=seed))
        await server.set_global_steps(3)
        outs = await asyncio.gather(
            *[server.generate(p, dict(params), f"x{i}") for i, p in enumerate(PROMPTS * 2)]
        )
        await server.shutdown()
        return outs

    a, b, c = run(sample(11)), run(sample(11)), run(sample(12))
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.token_ids for o in a] != [o.token_ids for o in c]
    # the same prompt sent twice draws different samples (n > 1 rollouts of one prompt)
    assert [o.token_ids for o in a[:8]] != [o.token_ids for o in a[8:]]
    assert all(o.extra_fields["global_steps"] == 3 for o in a)


def test_weight_loading_and_bad_inputs(model_path):
    async def main():
        server = await _launch(make_server(model_path))
        before = await server.generate(PROMPTS[0], dict(GREEDY), "w0")
        state = server.engine.model.state_dict()
        name = "model.layers.0.mlp.down_proj.weight"
        torch.manual_seed(0)
        n = await server.load_weights([(name, torch.randn_like(state[name]) * 0.5)])
        after = await server.generate(PROMPTS[0], dict(GREEDY), "w1")
        errors = []
        for bad in (
            lambda: server.load_weights([("no.such.weight", torch.zeros(1))]),
            lambda: server.generate([], dict(GREEDY), "e"),
            lambda: server.generate([10**6], dict(GREEDY), "e"),
            lambda: server.generate(PROMPTS[0], dict(GREEDY, top_k=-2), "e"),
            lambda: server.generate(PROMPTS[0], dict(GREEDY, temperature=-1), "e"),
        ):
            try:
                await bad()
                errors.append(None)
            except (KeyError, ValueError) as e:
                errors.append(type(e).__name__)
        await server.shutdown()
        return n, before, after, errors

    n, before, after, errors = run(main())
    assert n == 1
    assert before.log_probs != after.log_probs
    assert errors == ["KeyError", "ValueError", "ValueError", "ValidationError", "ValidationError"]


def test_weight_sync_prints_the_served_weights_fingerprint(model_path, capsys):
    """set_global_steps (the end of a sync) prints the fingerprint; it moves when a tensor changes, not otherwise."""

    async def main():
        server = await _launch(make_server(model_path))
        await server.set_global_steps(0)
        same = server.engine.weights_fingerprint()
        await server.set_global_steps(0)
        state = server.engine.model.state_dict()
        name = "model.layers.0.mlp.down_proj.weight"
        await server.load_weights([(name, state[name] + 0.25)])
        await server.set_global_steps(1)
        await server.shutdown()
        return same

    same = run(main())
    lines = [x for x in capsys.readouterr().out.splitlines() if "weights of step" in x]
    assert len(lines) == 3, lines
    fps = [float(x.rsplit("fingerprint ", 1)[1].rstrip(")")) for x in lines]
    assert lines[0].startswith("hf rollout replica 0: weights of step 0 (0 tensors loaded so far, fingerprint ")
    assert lines[2].startswith("hf rollout replica 0: weights of step 1 (1 tensors loaded so far, fingerprint ")
    assert fps[0] == fps[1] == pytest.approx(same, rel=1e-12)
    # at most 4096 strided elements of the [64, 128] weight were sampled, each moved by exactly 0.25
    assert fps[2] - fps[1] == pytest.approx(0.25 * 4096, rel=1e-9)


def test_sampling_params_parse_vllm_conventions():
    p = SamplingParams.from_request({"max_new_tokens": 5, "top_k": -1, "stop_token_ids": None, "unknown": 1})
    assert p.max_tokens == 5 and p.top_k == -1 and p.stop_token_ids == [] and not p.greedy
    assert SamplingParams.from_request({"temperature": 0}).greedy
    with pytest.raises(ValueError):
        SamplingParams.from_request({"top_p": 0})
