"""One policy update with STARE's weights vs without (issue 13 item 1, unit level).

Same tiny transformers policy, same sampled batch and seed, verl's own clipped policy loss, one SGD step:
with W = 3 (gate on) vs W = 1. The parameters end up different, and to first order the entropy at the
reweighted (L+) positions rises relative to the W = 1 update, as STARE's first-order analysis predicts:
``dH(s) ~ eta * A * Phi(a|s)`` with ``Phi = p_a (s_a - H(s)) + C(s)``, ``C >= 0``, so an extra push on a
rewarded token whose surprisal exceeds its state's entropy raises that entropy.
"""

import copy

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

from envs.tiny_hf import TinyModelConfig, build_model
from stare_verl.methods.stare import compute_stare_advantage

pytestmark = pytest.mark.integration

VOCAB, PROMPT, T, B, GROUP = 48, 4, 10, 8, 4
LR = 0.05
ACTOR = OmegaConf.create(
    {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 10.0, "global_batch_info": {}}
)


def _policy(seed=0):
    shape = TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)  # fmt: skip
    return build_model(config=shape, seed=seed, vocab_size=VOCAB).eval()


def _token_stats(model, ids):
    """Log-prob of each response token and the entropy of its state (nats), both [B, T]."""
    logits = model(input_ids=ids).logits[:, PROMPT - 1 : -1].float()
    logp = torch.log_softmax(logits, dim=-1)
    taken = logp.gather(-1, ids[:, PROMPT:, None])[..., 0]
    ent = -(logp.exp() * logp).sum(-1)
    return taken, ent, logp


def _sample(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (B // GROUP, PROMPT), generator=g).repeat_interleave(GROUP, dim=0)
    with torch.no_grad():
        for _ in range(T):
            probs = torch.softmax(model(input_ids=ids).logits[:, -1].float(), dim=-1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=g)], dim=1)
    return ids


def _update(model, ids, advantages, old_log_probs, mask):
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    log_probs, _, _ = _token_stats(model, ids)
    loss, _ = compute_policy_loss_vanilla(old_log_probs, log_probs, advantages, mask.bool(), "token-mean", ACTOR)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return model


def _setting(seed=0):
    model = _policy(seed)
    ids = _sample(model, seed + 1)
    mask = torch.ones(B, T)
    with torch.no_grad():
        old_lp, ent, logp = _token_stats(model, ids)
    rewards = torch.zeros(B, T)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    uid = np.array([f"p{i // GROUP}" for i in range(B)], dtype=object)
    adv = {}
    for w in (1.0, 3.0):
        algo = OmegaConf.create(
            {"norm_adv_by_std_in_grpo": True, "stare": {"reweight_w": w, "target_entropy": 100.0, "top_p_ratio": 0.2}}
        )
        adv[w], _ = compute_stare_advantage(rewards, mask, uid, algo, old_log_probs=old_lp, entropys=ent)
    return model, ids, mask, old_lp, ent, logp, adv


def test_weights_change_the_update():
    model, ids, mask, old_lp, _, _, adv = _setting()
    l_plus = adv[3.0] != adv[1.0]
    assert int(l_plus.sum()) == 8  # ceil(0.2 * 40 tokens of the 4 rewarded responses)
    torch.testing.assert_close(adv[3.0][l_plus], 3 * adv[1.0][l_plus])
    m1 = _update(model, ids, adv[1.0], old_lp, mask)
    m3 = _update(model, ids, adv[3.0], old_lp, mask)
    p0, p1, p3 = (torch.cat([p.detach().flatten() for p in m.parameters()]) for m in (model, m1, m3))
    assert (p1 - p0).abs().max() > 0
    diff = (p3 - p1).abs()
    assert diff.max() > 1e-4 and diff.max() > 1e-2 * (p1 - p0).abs().max()


@pytest.mark.parametrize("seed", range(6))
def test_entropy_rises_at_reweighted_positions(seed):
    """Mean over the L+ positions, per seed. In a shared-parameter network the update of one token also moves
    other states' entropy (off-diagonal terms of the first-order expansion), so single positions may go either
    way (measured: 50-100% of them rise, depending on the seed); the mean over L+ rose for 8 of 8 seeds."""
    model, ids, mask, old_lp, ent, logp, adv = _setting(seed)
    l_plus = adv[3.0] != adv[1.0]
    # the precondition of the first-order sign: Phi(a|s) = p_a (s_a - H) + C(s) > 0 at the L+ tokens
    p = logp.exp()
    s_a = -old_lp
    c = (p.pow(2) * (ent[..., None] + logp)).sum(-1)
    phi = s_a.neg().exp() * (s_a - ent) + c
    assert (phi[l_plus] > 0).all()
    m1, m3 = (_update(model, ids, adv[w], old_lp, mask) for w in (1.0, 3.0))
    with torch.no_grad():
        (_, h1, _), (_, h3, _) = _token_stats(m1, ids), _token_stats(m3, ids)
    delta = (h3 - h1)[l_plus]
    assert delta.mean() > 0, delta
    assert (delta > 0).float().mean() >= 0.5, delta
