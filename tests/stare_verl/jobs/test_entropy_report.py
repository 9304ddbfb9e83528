"""runlog.entropy_report / format_entropy_report: the end-of-run entropy report (issue 30), on the metrics of real
tool-use CPU runs (30 steps from the default SFT checkpoint, seed 0; values rounded to 4 digits)."""

import pytest

from stare_verl.jobs.runlog import entropy_report, format_entropy_report

# GRPO-ds twin (--method grpo, target 0.03): stare/batch_entropy, stare/gate_on, stare/frac_l_plus per step
GRPO_ENT = [0.0214, 0.0112, 0.0129, 0.0474, 0.0094, 0.0238, 0.042, 0.013, 0.0153, 0.0213, 0.011, 0.0195, 0.0292,
            0.0119, 0.0139, 0.0086, 0.0188, 0.0199, 0.0325, 0.0309, 0.0151, 0.011, 0.011, 0.0171, 0.0152, 0.0102,
            0.0073, 0.0083, 0.0098, 0.0279]  # fmt: skip
GRPO_GATE = [1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
GRPO_FRAC = [0.0252, 0.0121, 0.04, 0.0, 0.0129, 0.021, 0.0, 0.0236, 0.0443, 0.0326, 0.0128, 0.0128, 0.0281, 0.0224,
             0.0355, 0.0341, 0.002, 0.0322, 0.0, 0.0, 0.0411, 0.0313, 0.0, 0.0128, 0.0258, 0.0214, 0.0112, 0.0102,
             0.0309, 0.0344]  # fmt: skip
BEFORE = {"T=0": {"accuracy": 0.89, "n": 200}, "T=1": {"accuracy": 0.735, "n": 200}}
GRPO_AFTER = {"T=0": {"accuracy": 0.9, "n": 200}, "T=1": {"accuracy": 0.855, "n": 200}}


def _rows(ent, gate, frac, w, target, m=0.9):
    """metrics.jsonl rows as the run wrote them (O1: L- never holds a token; stare/m is logged all the same)."""
    return [
        {
            "step": i + 1,
            "actor/entropy": e,
            "stare/batch_entropy": e,
            "stare/target_entropy": target,
            "stare/gate_on": float(g),
            "stare/w": w,
            "stare/m": m,
            "stare/frac_l_plus": f,
            "stare/frac_l_minus": 0.0,
            "stare/mean_weight": 1.0 + (w - 1.0) * f * g,
        }
        for i, (e, g, f) in enumerate(zip(ent, gate, frac, strict=True))
    ]


def test_grpo_twin_reports_the_drift_and_no_reweighting():
    rep = entropy_report(_rows(GRPO_ENT, GRPO_GATE, GRPO_FRAC, 1.0, 0.03, m=1.0), BEFORE, GRPO_AFTER)
    assert rep["entropy_key"] == "stare/batch_entropy" and rep["steps"] == 30 and rep["quarter_steps"] == 7
    assert rep["entropy_first_quarter"] == pytest.approx(sum(GRPO_ENT[:7]) / 7)  # 0.0240
    assert rep["entropy_last_quarter"] == pytest.approx(sum(GRPO_ENT[-7:]) / 7)  # 0.0137
    assert rep["last_quarter_over_target"] == pytest.approx(0.4562, abs=1e-4)
    assert (rep["gate_on_steps"], rep["gate_steps"], rep["gate_on_share"]) == (26, 30, pytest.approx(26 / 30))
    assert rep["reweighting"] is False and rep["l_plus_weight"] == 1.0 and rep["l_minus_weight"] is None
    assert rep["mean_token_weight"] == 1.0
    assert rep["acc_before"] == {"greedy": 0.89, "T=1": 0.735}
    assert rep["acc_after"] == {"greedy": 0.9, "T=1": 0.855}
    assert rep["verdict"] == "below" and rep["below_with_gate_on"] is True
    assert "GRPO-ds twin" in rep["message"] and "NOT HELD" not in rep["message"]
    lines = format_entropy_report(rep)
    assert lines[0] == (
        "entropy (stare/batch_entropy): first quarter 0.0240, last quarter 0.0137 vs target 0.03 (0.46 x); "
        "gate on in 26 of 30 steps"
    )
    assert "L+ 1.00" in lines[1] and "L- untouched;" in lines[1]
    assert lines[2] == "held-out accuracy: greedy 0.890 -> 0.900, T = 1 0.735 -> 0.855"
    assert lines[-1] == rep["message"]


def test_stare_run_far_below_the_target_with_the_gate_on_says_so():
    # the same trajectory as a STARE run (W 1.1, the paper's setting) would be reported: not held, and why
    rep = entropy_report(_rows(GRPO_ENT, GRPO_GATE, GRPO_FRAC, 1.1, 0.03), BEFORE, GRPO_AFTER)
    assert rep["reweighting"] is True and rep["l_plus_weight"] == pytest.approx(1.1)
    assert rep["l_minus_weight"] is None  # O1: m is logged but L- is empty
    assert rep["l_plus_token_share"] == pytest.approx(sum(GRPO_FRAC) / 26)
    assert rep["mean_token_weight"] == pytest.approx(1.0 + 0.1 * sum(GRPO_FRAC) / 30)
    assert rep["verdict"] == "below" and rep["below_with_gate_on"] is True
    assert rep["message"].startswith("ENTROPY NOT HELD: last-quarter entropy 0.0137 = 0.46 x the target 0.03")
    assert "7 of the last 7" in rep["message"] and "54% below the target" in rep["message"]
    c2 = entropy_report([{**r, "stare/frac_l_minus": r["stare/frac_l_plus"]}
                         for r in _rows(GRPO_ENT, GRPO_GATE, GRPO_FRAC, 1.1, 0.03)])
    assert c2["l_minus_weight"] == pytest.approx(0.9)
    assert f"L- 0.90 ({c2['l_minus_token_share']:.1%} of model tokens)" in format_entropy_report(c2)[1]


def test_held_above_and_missing():
    # within 25% of the target: held (the target 0.016 for the same trajectory: last quarter 0.0137 = 0.86 x)
    rep = entropy_report(_rows(GRPO_ENT, GRPO_GATE, GRPO_FRAC, 3.0, 0.016))
    assert rep["verdict"] == "held" and rep["message"].startswith("entropy held (within 25% of the target): ")
    weights = format_entropy_report(rep)[1]
    assert weights.startswith("weights with the gate on: L+ 3.00 (") and ", L- untouched; mean token weight" in weights
    assert rep["acc_before"] == {"greedy": None, "T=1": None}
    assert not any(line.startswith("held-out") for line in format_entropy_report(rep))
    # near the target with the gate never on: not "held" by STARE; and a 2-step run is too short to read
    rep = entropy_report(_rows(GRPO_ENT, [0] * 30, [0.0] * 30, 3.0, 0.016))
    assert rep["verdict"] == "held" and rep["message"].startswith(
        "entropy within 25% of the target with the gate never on (nothing reweighted): ")
    assert "too few" not in rep["message"]
    rep = entropy_report(_rows(GRPO_ENT[:2], [0, 0], [0.0, 0.0], 1.1, 0.012))  # last step 0.0112: 0.93 x
    assert rep["message"].startswith("entropy within 25% of the target with the gate never on")
    assert rep["message"].endswith(" (2 steps: too few to read a trend from)")
    rep = entropy_report(_rows(GRPO_ENT, [0] * 30, [0.0] * 30, 3.0, 0.01))
    assert rep["verdict"] == "above" and rep["gate_on_share"] == 0 and rep["l_plus_weight"] is None
    assert rep["l_plus_token_share"] is None and "gate stays off" in rep["message"]
    # a run from before the stare/* metrics: actor/entropy, no target
    rep = entropy_report([{"step": 1, "actor/entropy": 0.02}])
    assert rep["entropy_key"] == "actor/entropy" and rep["verdict"] is None and rep["gate_on_share"] is None
    assert format_entropy_report(rep)[-1] == "no entropy or target logged"
    assert entropy_report([])["steps"] == 0


def test_share_of_l_plus_tokens_above_their_entropy_over_gated_steps():
    rows = _rows(GRPO_ENT, GRPO_GATE, GRPO_FRAC, 1.1, 0.03)
    for i, r in enumerate(rows):  # gated steps: 0.2 / 0.4 alternating; off steps log -1 (nothing selected)
        r["stare/l_plus_above_entropy"] = (0.2 if i % 2 else 0.4) if r["stare/gate_on"] else -1.0
        r["stare/l_minus_above_entropy"] = -1.0  # O1
    rep = entropy_report(rows, BEFORE, GRPO_AFTER)
    on = [i for i, g in enumerate(GRPO_GATE) if g]
    assert rep["l_plus_above_entropy"] == pytest.approx(sum(0.2 if i % 2 else 0.4 for i in on) / len(on))
    assert rep["l_minus_above_entropy"] is None
    line = next(ln for ln in format_entropy_report(rep) if ln.startswith("L+ tokens whose surprisal"))
    assert line.endswith(f"{rep['l_plus_above_entropy']:.0%}") and "L- tokens" not in line
    # runs of before the metric: no line
    assert entropy_report(_rows(GRPO_ENT, GRPO_GATE, GRPO_FRAC, 1.1, 0.03), BEFORE, GRPO_AFTER)["l_plus_above_entropy"] is None


def test_damaged_rows_read_as_missing_values_not_errors():
    """A hand-made or damaged metrics.jsonl: rows without a step, nulls, NaN, words and non-dicts never raise; the
    report is that of the readable values."""
    rows = _rows(GRPO_ENT, GRPO_GATE, GRPO_FRAC, 3.0, 0.016)
    clean = entropy_report(rows)
    damaged = [dict(r) for r in rows]
    damaged[0]["stare/m"] = None
    damaged[1]["stare/batch_entropy"] = float("nan")
    damaged[2]["stare/w"] = "three"
    del damaged[3]["step"]
    damaged += [None, "row", {"step": None, "stare/batch_entropy": 9.0}]
    rep = entropy_report(damaged)
    assert rep["steps"] == 28  # the NaN entropy and the step-less row are not read
    assert rep["target_entropy"] == 0.016 and rep["verdict"] in {"held", "below", "above"}
    assert rep["l_plus_weight"] == pytest.approx(3.0) == clean["l_plus_weight"]
    assert format_entropy_report(rep)[-1] == rep["message"]
    nan_only = entropy_report([{"step": 1, "stare/batch_entropy": float("nan"), "stare/target_entropy": 0.02}])
    assert nan_only["verdict"] is None and nan_only["message"] == "no entropy or target logged"


def test_new_runs_log_the_shared_quantities_under_entropy_control_and_read_alike():
    """A run that logs batch entropy and target as ``entropy_control/*`` (STARE's own gate and weights stay
    ``stare/*``) gives the report of an older run that logged them as ``stare/*``."""
    old = _rows(GRPO_ENT, GRPO_GATE, GRPO_FRAC, 1.0, 0.03, m=1.0)
    new = [{("entropy_control/" + k.split("/", 1)[1] if k in ("stare/batch_entropy", "stare/target_entropy") else k): v
            for k, v in r.items()} for r in old]  # fmt: skip
    rep_old, rep_new = entropy_report(old, BEFORE, GRPO_AFTER), entropy_report(new, BEFORE, GRPO_AFTER)
    assert rep_old["entropy_key"] == "stare/batch_entropy" and rep_new["entropy_key"] == "entropy_control/batch_entropy"
    assert rep_new["target_entropy"] == 0.03 and rep_new["gate_on_steps"] == sum(GRPO_GATE)
    assert {k: v for k, v in rep_new.items() if k != "entropy_key"} == {
        k: v for k, v in rep_old.items() if k != "entropy_key"}


def test_a_method_without_stares_gate_is_not_reported_as_the_grpo_twin():
    """Another entropy control (REPO-R here) logs no ``stare/gate_on``: its report said "gate on in 0 of 0 steps"
    and "no reweighting (W = M = 1, the GRPO-ds twin)" (a fresh user's find). Now no gate and no STARE weights."""
    rows = [{"step": i + 1, "entropy_control/batch_entropy": e, "entropy_control/target_entropy": 0.03, "repo_r/zeta": 0.001}
            for i, e in enumerate(GRPO_ENT)]  # fmt: skip
    rep = entropy_report(rows, BEFORE, GRPO_AFTER)
    assert rep["gate_steps"] == 0 and rep["target_entropy"] == 0.03
    assert "GRPO-ds twin" not in rep["message"] and "gate on" not in rep["message"]
    assert rep["message"].endswith("no STARE gate logged (another entropy control: its own metrics are under its prefix)")
    lines = format_entropy_report(rep)
    assert lines[0].endswith("vs target 0.03 (0.46 x)") and not any("gate" in ln for ln in lines[:-1])
    assert not any(ln.startswith("weights with the gate on") for ln in lines)
