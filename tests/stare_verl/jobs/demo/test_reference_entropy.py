"""The held-out entropy probe (issue 30): ``reference_entropy`` on fixed episodes, its place in the run's
``entropy_report`` and the train job's cache of the episodes next to the SFT checkpoint."""

import json
import math

import pytest
import torch

from envs.tiny_hf import TinyModelConfig, build_model
from stare_verl.jobs.demo.evaluate import reference_entropy
from stare_verl.jobs.runlog import entropy_report, format_entropy_report

VOCAB = 40


@pytest.fixture(scope="module")
def model():
    cfg = TinyModelConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                          intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    return build_model(None, cfg, seed=3, vocab_size=VOCAB).eval()


def _by_hand(model, episodes):
    """Entropy and NLL per model token, one position at a time, in float64."""
    h, nll, n = 0.0, 0.0, 0
    for ids, mask in episodes:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double()
        for t in range(len(ids) - 1):
            if mask[t + 1]:
                p = torch.softmax(logits[t], -1)
                h += float(-(p * p.log()).sum())
                nll += float(-p[ids[t + 1]].log())
                n += 1
    return h / n, nll / n, n


EPISODES = [
    ([1, 5, 7, 9, 11, 2, 3], [0, 0, 1, 1, 0, 0, 1]),  # prompt, two model tokens, two tool tokens, a model token
    ([4, 4, 8], [0, 1, 1]),
    ([6, 12, 13, 14, 15, 16, 17, 18, 19, 20], [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]),
]


def test_entropy_and_nll_over_model_tokens_only(model):
    h, nll, n = _by_hand(model, EPISODES)
    for batch_size in (1, 2, 64):  # right padding in a batch changes nothing
        got = reference_entropy(model, EPISODES, batch_size=batch_size)
        assert got["tokens"] == n == 10 and got["episodes"] == 3
        assert got["entropy"] == pytest.approx(h, rel=1e-5)
        assert got["nll"] == pytest.approx(nll, rel=1e-5)
    assert 0 < got["entropy"] < math.log(VOCAB)
    # a position of mask 0 is not measured: flipping the tool tokens' mask to 1 changes the value
    flipped = [(ids, [0] + [1] * (len(ids) - 1)) for ids, _ in EPISODES]
    assert reference_entropy(model, flipped)["tokens"] == sum(len(ids) - 1 for ids, _ in EPISODES)
    assert reference_entropy(model, flipped)["entropy"] != pytest.approx(got["entropy"], rel=1e-6)


def test_empty_and_one_token_episodes_measure_nothing_beside_others(model):
    alone = reference_entropy(model, EPISODES)
    mixed = reference_entropy(model, [([], []), *EPISODES, ([7], [1])], batch_size=8)
    assert (mixed["entropy"], mixed["tokens"], mixed["episodes"]) == pytest.approx(
        (alone["entropy"], alone["tokens"], 5))


def test_a_sharper_policy_reads_lower(model):
    sharp = build_model(None, TinyModelConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        num_key_value_heads=1, intermediate_size=64, max_position_embeddings=64),
                        seed=3, vocab_size=VOCAB).eval()  # fmt: skip
    with torch.no_grad():
        sharp.lm_head.weight.mul_(20.0)  # logits x 20 (untied head): a near-deterministic policy
    assert reference_entropy(sharp, EPISODES)["entropy"] < 0.5 * reference_entropy(model, EPISODES)["entropy"]


def test_bad_episodes_raise(model):
    with pytest.raises(ValueError, match="ids and"):
        reference_entropy(model, [([1, 2, 3], [0, 1])])
    with pytest.raises(ValueError, match="episode 0: mask entries must be 0 or 1"):
        reference_entropy(model, [([1, 2, 3], [0, 2, 1])])
    with pytest.raises(ValueError, match="episode 1: ids and mask must be integers"):
        reference_entropy(model, [([1, 2], [0, 1]), ([1.5, 2], [0, 1])])
    with pytest.raises(ValueError, match="episode 0 has 65 tokens, more than the model's 64 positions"):
        reference_entropy(model, [([1] * 65, [0] + [1] * 64)])
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        reference_entropy(model, EPISODES, batch_size=0)
    with pytest.raises(ValueError, match="token id 40 is outside the model's vocabulary of 40"):
        reference_entropy(model, [([1, 2, 40], [0, 1, 1])])
    with pytest.raises(ValueError, match="token id -1 is outside"):
        reference_entropy(model, [([1, -1, 3], [0, 1, 1])])
    with pytest.raises(ValueError, match="no model token"):
        reference_entropy(model, [])
    with pytest.raises(ValueError, match="no model token"):
        reference_entropy(model, [([1, 2, 3], [1, 0, 0]), ([4], [1])])  # a first-token mask predicts nothing


def _rows(n=8):
    return [{"step": i + 1, "stare/batch_entropy": 0.04, "stare/target_entropy": 0.04, "stare/gate_on": 0.0,
             "stare/w": 1.1, "stare/m": 0.9, "stare/frac_l_plus": 0.0, "stare/frac_l_minus": 0.0,
             "stare/mean_weight": 1.0} for i in range(n)]  # fmt: skip


def test_entropy_report_carries_the_heldout_probe():
    before = {"entropy": 0.0413, "nll": 0.026, "episodes": 200, "tokens": 7458}
    after = {"entropy": 0.0310, "nll": 0.041, "episodes": 200, "tokens": 7458}
    rep = entropy_report(_rows(), heldout={"before": before, "after": after})
    assert rep["heldout_entropy"]["ratio"] == pytest.approx(0.0310 / 0.0413)
    line = [x for x in format_entropy_report(rep) if x.startswith("held-out entropy")]
    assert line == ["held-out entropy (teacher-forced on 200 held-out demonstrations, 7458 model tokens): "
                    "0.0413 -> 0.0310 (0.75 x); their NLL 0.0260 -> 0.0410"]  # fmt: skip
    for missing in (None, {"before": before}, {"after": after}, {"before": 1, "after": after},
                    {"before": {"entropy": 0.04}, "after": after}, {"before": before, "after": "x"}):
        rep = entropy_report(_rows(), heldout=missing)
        assert rep["heldout_entropy"] is None
        assert not any(x.startswith("held-out entropy") for x in format_entropy_report(rep))


def test_train_caches_the_episodes_and_survives_a_failing_probe(tmp_path, monkeypatch, capsys):
    import stare_verl.jobs.demo.evaluate as ev
    from stare_verl.jobs import train

    calls = {"episodes": 0, "entropy": []}

    def episodes(path, n):
        calls["episodes"] += 1
        return [([1, 2, 3], [0, 1, 1])] * n

    def entropy(path, eps):
        calls["entropy"].append(str(path))
        return {"entropy": 0.05 if "sft" in str(path) else 0.04, "nll": 0.1, "episodes": len(eps), "tokens": 2}

    monkeypatch.setattr(ev, "heldout_episodes", episodes)
    monkeypatch.setattr(ev, "heldout_entropy", entropy)
    sft = tmp_path / "sft"
    sft.mkdir()
    got = train.heldout_entropy_curve(sft, [(30, tmp_path / "rl")], 3, "t")
    assert got["before"]["entropy"] == 0.05 and got["after"]["entropy"] == 0.04
    assert json.loads((sft / "heldout_entropy_n3.json").read_text())["episodes"] == [[[1, 2, 3], [0, 1, 1]]] * 3
    again = train.heldout_entropy_curve(sft, [(30, tmp_path / "rl2")], 3, "t")  # from the cache: no new episodes, no SFT read
    assert (again["before"], again["after"]) == (got["before"], got["after"])
    assert calls["episodes"] == 1 and calls["entropy"] == [str(sft), str(tmp_path / "rl"), str(tmp_path / "rl2")]
    (sft / "heldout_entropy_n3.json").write_text("{torn")  # a torn cache is built again
    assert train.heldout_entropy_curve(sft, [(30, tmp_path / "rl")], 3, "t")["before"]["entropy"] == 0.05
    assert calls["episodes"] == 2
    # so is JSON of another shape (a user's hand edit, another version's file): the run never loses the probe
    good = json.loads((sft / "heldout_entropy_n3.json").read_text())
    for n, foreign in enumerate([{"episodes": 5, "before": 1}, {"episodes": [], "before": {}},
                                 {**good, "before": 1}, {**good, "before": {"entropy": 0.05}}, [1, 2]], start=3):
        (sft / "heldout_entropy_n3.json").write_text(json.dumps(foreign))
        assert train.heldout_entropy_curve(sft, [(30, tmp_path / "rl")], 3, "t")["before"]["entropy"] == 0.05
        assert calls["episodes"] == n
        assert json.loads((sft / "heldout_entropy_n3.json").read_text()) == good

    def no_sandbox(path, n):
        raise RuntimeError("no sandbox backend")

    monkeypatch.setattr(ev, "heldout_episodes", no_sandbox)
    assert train.heldout_entropy_curve(sft, [(30, tmp_path / "rl")], 5, "t") is None
    err = capsys.readouterr().err
    assert "warning: no held-out entropy (RuntimeError: no sandbox backend)" in err and "delete" not in err
