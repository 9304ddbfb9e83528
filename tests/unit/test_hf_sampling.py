"""The hf server's batched sampler (``sample_batch``) and its counter-based random streams."""

from __future__ import annotations

import math

import torch

from stare_verl.cpu.hf_server import sample_batch, stream_uniform

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, float("-inf")])


def draw(logits, n, seed=3, **kw):
    """n draws from one row of logits, each with its own uniform of stream ``seed``."""
    rows = logits.expand(n, -1).contiguous()
    return sample_batch(
        rows,
        temperature=[kw.get("temperature", 1.0)] * n,
        top_k=[kw.get("top_k", -1)] * n,
        top_p=[kw.get("top_p", 1.0)] * n,
        uniform=[stream_uniform(seed, i) for i in range(n)],
    )


def test_stream_uniform_is_deterministic_in_range_and_uniform():
    xs = [stream_uniform(17, i) for i in range(20000)]
    assert xs == [stream_uniform(17, i) for i in range(20000)]
    assert all(0.0 <= x < 1.0 for x in xs)
    assert abs(sum(xs) / len(xs) - 0.5) < 0.01
    # ten equal bins each hold about a tenth
    counts = [0] * 10
    for x in xs:
        counts[int(x * 10)] += 1
    assert max(abs(c - 2000) for c in counts) < 150
    # another seed is another stream
    assert (
        sum(a == b for a, b in zip(xs[:100], [stream_uniform(18, i) for i in range(100)], strict=True)) == 0
    )


def test_draws_follow_the_softmax_and_never_a_zero_probability_token():
    n = 20000
    tokens, logp = draw(LOGITS, n)
    probs = torch.softmax(LOGITS, -1)
    freq = torch.bincount(tokens, minlength=6).double() / n
    assert torch.allclose(freq, probs.double(), atol=0.012), (freq, probs)
    assert int((tokens == 5).sum()) == 0
    assert torch.allclose(logp, torch.log_softmax(LOGITS, -1)[tokens])


def test_temperature_sharpens_and_logprob_is_the_tempered_one():
    tokens, logp = draw(LOGITS, 4000, temperature=0.5)
    ref = torch.log_softmax(LOGITS / 0.5, -1)
    assert torch.allclose(logp, ref[tokens])
    freq0 = float((tokens == 0).double().mean())
    assert abs(freq0 - math.exp(float(ref[0]))) < 0.03


def test_top_k_and_top_p_truncate_and_renormalise():
    tokens, logp = draw(LOGITS, 3000, top_k=2)
    assert set(tokens.tolist()) == {0, 1}
    ref = torch.log_softmax(LOGITS[:2], -1)
    assert torch.allclose(logp, ref[tokens])
    # probs ~ [0.53, 0.20, 0.12, 0.07, 0.03, 0]: top_p 0.6 keeps the two likeliest (0.53 < 0.6 <= 0.73)
    tokens, logp = draw(LOGITS, 3000, top_p=0.6)
    assert set(tokens.tolist()) == {0, 1}
    assert torch.allclose(logp, ref[tokens])
    # top_p below the likeliest token's probability still keeps that token
    tokens, logp = draw(LOGITS, 200, top_p=0.01)
    assert set(tokens.tolist()) == {0} and torch.allclose(logp, torch.zeros(200))


def test_extreme_uniforms_stay_on_the_support():
    logits = torch.tensor([[float("-inf"), 0.0, 1.0, float("-inf")]] * 3)
    tokens, _ = sample_batch(logits, [1.0] * 3, [-1] * 3, [1.0] * 3, [0.0, 0.5, 1.0 - 2.0**-53])
    assert tokens.tolist()[0] == 1 and tokens.tolist()[2] == 2


def test_greedy_rows_mix_with_sampled_rows_and_batch_mates_do_not_matter():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 40, generator=g)
    temps, ks, ps = [0.7, 0.0, 1.0, 1.3, 1.0], [-1, -1, 5, -1, 0], [1.0, 1.0, 0.9, 0.8, 1.0]
    us = [0.3, None, 0.9, 0.1, 0.999]
    tokens, logp = sample_batch(logits, temps, ks, ps, us)
    # the greedy row: argmax of the raw logits, untempered log-prob
    assert int(tokens[1]) == int(logits[1].argmax())
    assert math.isclose(float(logp[1]), float(torch.log_softmax(logits[1], -1).max()), rel_tol=1e-6)
    # each row alone gives the same token and log-prob as in the batch
    for i in range(5):
        t1, l1 = sample_batch(
            logits[i : i + 1], temps[i : i + 1], ks[i : i + 1], ps[i : i + 1], us[i : i + 1]
        )
        assert int(t1[0]) == int(tokens[i]) and math.isclose(float(l1[0]), float(logp[i]), rel_tol=1e-6)
    # the top-k row only draws among its 5 largest logits
    assert int(tokens[2]) in set(torch.topk(logits[2], 5).indices.tolist())
