"""The compiled group baseline (``stare_verl.methods.group_kernels``, used by ``group_row_advantage``) against verl's
``grpo_vectorized`` itself, bit for bit, and the string-label grouping against verl's ``as_torch_index``."""

import uuid

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import compute_grpo_vectorized_outcome_advantage
from verl.utils.groupwise import as_torch_index

from stare_verl.methods import group_baseline
from stare_verl.methods.group_baseline import GroupConfig, group_row_advantage, verl_group_codes


def _labels(codes, kind, rng):
    names = {
        "uuid": lambda c: str(uuid.UUID(int=int(c) * 7919 + 13)),
        "prefix": lambda c: f"q{c}",
        "mixed": lambda c: f"{c:02d}" if c % 3 else f"x{c}",  # some read as integers, one does not: factorised
    }[kind]
    perm = rng.permutation(int(codes.max()) + 1)  # labels not in order of appearance
    return np.array([names(perm[c]) for c in codes], dtype=object)


def _case(seed, b, dtype):
    rng = np.random.default_rng(seed)
    sizes = rng.choice([1, 2, 3, 5, 8, 16, 64], size=b)
    codes = np.repeat(np.arange(b), sizes)[:b]
    rng.shuffle(codes)  # a group's rows scattered over the batch, as after verl's balancing
    kind = rng.integers(4)
    if kind == 0:  # binary outcome rewards
        r = rng.integers(0, 2, b).astype(np.float64)
    elif kind == 1:  # graded rewards with float residue
        r = rng.integers(0, 11, b) / 10.0
    elif kind == 2:  # arbitrary reals, several scales
        r = rng.normal(0, 10.0 ** rng.integers(-4, 4), b)
    else:  # each group's rewards equal up to a few ulps, or exactly
        r = np.round(rng.normal(size=codes.max() + 1), 3)[codes] * (1 + rng.integers(-3, 4, b) * 1e-7)
    return codes, torch.tensor(r, dtype=dtype)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", range(12))
def test_row_advantages_are_verl_grpo_vectorized_bit_for_bit(seed, dtype, norm):
    b = [1, 2, 7, 64, 512, 1000][seed % 6]
    codes, scores = _case(seed, b, dtype)
    labels = _labels(codes, ["uuid", "prefix", "mixed"][seed % 3], np.random.default_rng(seed))
    eps = [1e-6, 1e-3, 0.0][seed % 3]
    cfg = GroupConfig(norm_adv_by_std_in_grpo=norm, epsilon=eps)
    rewards = torch.zeros(b, 3, dtype=dtype)
    rewards[:, 1] = scores  # the outcome reward at one token, as verl's reward managers place it
    mask = torch.ones(b, 3)
    row, share = group_row_advantage(rewards, mask, labels, cfg)
    verl, _ = compute_grpo_vectorized_outcome_advantage(rewards, mask, labels, epsilon=eps, norm_adv_by_std_in_grpo=norm)
    grouped, n_groups = verl_group_codes(labels)
    scores64 = rewards.sum(-1).double().numpy()
    zero = group_baseline.zero_variance_groups(scores64, grouped, n_groups, np.ones(b, dtype=bool))
    expect = verl[:, 1].clone()
    expect[torch.from_numpy(zero[grouped])] = 0.0
    assert row.dtype == expect.dtype
    assert torch.equal(row, expect), (row - expect).abs().max()
    assert share == pytest.approx(np.count_nonzero(zero) / n_groups)


def test_the_zero_variance_groups_and_singletons():
    # a group of eight 0.7 (verl leaves +0.056 each), a group of one (A = r), a group of two different rewards
    labels = np.array(["a"] * 8 + ["b"] + ["c", "c"], dtype=object)
    rewards = torch.tensor([0.7] * 8 + [0.3] + [1.0, 0.0])[:, None]
    row, share = group_row_advantage(rewards, torch.ones(11, 1), labels, GroupConfig())
    assert torch.equal(row[:8], torch.zeros(8))
    assert float(row[8]) == pytest.approx(0.3 / (1 + 1e-6))
    assert row[9].item() == pytest.approx(0.5 / (0.5**0.5 + 1e-6), rel=1e-6)  # (1 - mean) / (std + epsilon)
    assert row[10].item() == -row[9].item()
    assert share == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    "labels",
    [
        ["b", "a", "b", "c"],  # strings: factorised
        ["01", "2", "1", "2"],  # all read as integers: verl groups "01" with "1"
        ["01", "2", "x", "1"],  # one does not read as an integer: four groups
        [" 1", "+1", "1", "1_0"],  # int() spellings verl reads as integers
        [1, 2, 1],  # not strings: verl's own path
        ["a", 1, "a"],  # mixed types: verl's own path
        [],
    ],
)
def test_string_labels_are_grouped_as_verl_groups_them(labels):
    index = np.array(labels, dtype=object)
    codes, n = verl_group_codes(index)
    g = as_torch_index(index, device="cpu").numpy()
    # the same partition of the rows, numbered by first appearance
    assert n == len(set(g.tolist()))
    for i in range(len(labels)):
        for j in range(len(labels)):
            assert (codes[i] == codes[j]) == (g[i] == g[j])
    assert list(dict.fromkeys(codes.tolist())) == list(range(n))  # numbered by first appearance


def test_only_object_arrays_of_non_integer_strings_take_the_fast_grouping():
    fast = group_baseline._string_label_codes
    assert fast(np.array(["q1", "q0", "q1"], dtype=object))[0].tolist() == [0, 1, 0]
    assert fast(np.array(["1", "01"], dtype=object)) is None  # integers: verl's rule merges them
    assert fast(np.array(["q1", "q0"])) is None  # a unicode array, not object
    assert fast(["q1", "q0"]) is None
    assert fast(np.array(["q1", 3], dtype=object)) is None


def test_integer_rewards_are_promoted_as_verl_promotes_them():
    labels = np.array(["a", "a", "b", "b"], dtype=object)
    rewards = torch.tensor([[1], [0], [2], [2]])
    row, share = group_row_advantage(rewards, torch.ones(4, 1), labels, GroupConfig())
    assert row.dtype == torch.float32
    assert torch.allclose(row, torch.tensor([0.5 / (0.5**0.5 + 1e-6), -0.5 / (0.5**0.5 + 1e-6), 0.0, 0.0]))
    assert share == 0.5
