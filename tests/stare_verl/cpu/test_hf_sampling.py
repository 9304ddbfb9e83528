"""The hf server's batched sampler (``sample_batch``) and its counter-based random streams."""

from __future__ import annotations

import math

import pytest
import torch

from stare_verl.cpu.hf_server import SamplingParams, _truncate_sorted, sample_batch, stream_uniform

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


def test_draws_across_vocabulary_blocks_follow_the_softmax():
    """V above 4 blocks takes the two-level CDF search; mass sits in the first, middle and last (partial) blocks,
    at block edges, with probability-0 tokens and whole empty blocks between them."""
    vocab = 6000
    logits = torch.full((vocab,), float("-inf"))
    for tok, val in ((3, 1.0), (1023, 0.5), (1024, 0.2), (3000, 1.5), (4095, -0.5), (5999, 0.8)):
        logits[tok] = val
    n = 20000
    tokens, logp = draw(logits, n, seed=11)
    probs = torch.softmax(logits, -1)
    freq = torch.bincount(tokens, minlength=vocab).double() / n
    support = probs > 0
    assert int(freq[~support].sum() * n) == 0
    assert torch.allclose(freq[support], probs[support].double(), atol=0.012), (freq[support], probs[support])
    assert torch.allclose(logp, torch.log_softmax(logits, -1)[tokens])


def test_top_k_alone_keeps_ties_and_matches_the_sorted_path():
    logits = torch.tensor([3.0, 1.0, 2.0, 2.0, 0.0, -1.0])
    tokens, logp = draw(logits, 3000, top_k=2)  # the 2nd largest value is tied: both 2.0 tokens stay
    assert set(tokens.tolist()) == {0, 2, 3}
    assert torch.allclose(
        logp, torch.log_softmax(logits.masked_fill(logits < 2.0, float("-inf")), -1)[tokens]
    )
    # top-k with top-p at 1 (topk path) and with top-p just below 1 (sort path) keep the same set
    a, _ = draw(logits, 500, top_k=2, top_p=1.0)
    b, _ = draw(logits, 500, top_k=2, top_p=0.9999999)
    assert a.tolist() == b.tolist()


def test_a_row_without_a_finite_distribution_is_an_error_not_a_token():
    ok = [0.0, 1.0, 2.0, 0.5]
    for bad in ([1.0, float("nan"), 0.0, 2.0], [1.0, float("inf"), 0.0, 2.0], [float("-inf")] * 4):
        logits = torch.tensor([ok, bad])
        with pytest.raises(ValueError, match=r"rows \[1\]"):
            sample_batch(logits, [1.0, 1.0], [-1, -1], [1.0, 1.0], [0.3, 0.3])
    # a temperature that overflows float32 logits
    with pytest.raises(ValueError, match="no finite sampling distribution"):
        sample_batch(torch.tensor([[30.0, 1.0]]), [1e-38], [-1], [1.0], [0.5])
    # such temperatures decode greedily in the engine (vLLM's sampling epsilon)
    assert SamplingParams(temperature=1e-6).greedy and not SamplingParams(temperature=1e-4).greedy


def test_greedy_batch_logprobs_are_the_untempered_softmax():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 50, generator=g)
    tokens, logp = sample_batch(logits, [0.0] * 4, [-1] * 4, [1.0] * 4, [None] * 4)
    assert tokens.tolist() == logits.argmax(-1).tolist()
    assert torch.allclose(logp, torch.log_softmax(logits, -1).gather(1, tokens[:, None])[:, 0], atol=1e-6)


def test_greedy_rows_without_a_finite_distribution_raise_too():
    ok = [0.0, 1.0, 2.0, 0.5]
    for bad in ([1.0, float("nan"), 0.0, 2.0], [1.0, float("inf"), 0.0, 2.0], [float("-inf")] * 4):
        with pytest.raises(ValueError, match=r"rows \[1\]"):  # greedy batch
            sample_batch(torch.tensor([ok, bad]), [0.0, 0.0], [-1, -1], [1.0, 1.0], [None, None])
        with pytest.raises(ValueError, match=r"rows \[1\]"):  # greedy row beside a sampled one
            sample_batch(torch.tensor([ok, bad]), [1.0, 0.0], [-1, -1], [1.0, 1.0], [0.4, None])
    with pytest.raises(ValueError):
        SamplingParams(temperature=float("inf"))
    with pytest.raises(ValueError):
        SamplingParams(repetition_penalty=float("nan"))


def test_a_top_p_one_row_is_not_cut_by_a_neighbours_top_p():
    """A large vocabulary, where a float32 cumsum passes 1: the top_p = 1 row keeps every token beside a top_p row."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 151936, generator=g) * 4
    cut = _truncate_sorted(x, [0, 0], [1.0, 0.9])
    assert torch.equal(cut[0], x[0])
    assert 0 < int(torch.isinf(cut[1]).sum()) < x.shape[1]
    # and so its draws and log-probs equal the row's alone
    for u in (0.3, 0.999):
        ta, la = sample_batch(x[:1], [1.0], [-1], [1.0], [u])
        tm, lm = sample_batch(x, [1.0, 1.0], [-1, -1], [1.0, 0.9], [u, 0.5])
        assert int(ta[0]) == int(tm[0]) and math.isclose(float(la[0]), float(lm[0]), abs_tol=2e-6)
