"""The GRPO-ds twin stays GRPO-ds whatever overrides a comparison passes to both methods (train.method_overrides)."""

import pytest

from stare_verl.jobs.recipes import compose_recipe
from stare_verl.jobs.train import method_overrides
from stare_verl.methods import parse_method_spec

PLACEHOLDERS = ["actor_rollout_ref.model.path=x", "data.train_files=x", "data.val_files=x",
                "trainer.default_local_dir=x"]  # fmt: skip
STARE_DOSE = ["algorithm.stare.reweight_w=3.0", "algorithm.stare.reweight_m=0.5", "algorithm.stare.top_p_ratio=0.02",
              "algorithm.stare.target_entropy=0.09"]  # fmt: skip


def test_stare_runs_take_the_overrides_as_given():
    assert method_overrides(parse_method_spec("stare"), STARE_DOSE) == STARE_DOSE


@pytest.mark.parametrize("family", ["shortcot", "tooluse"])
def test_the_twin_keeps_w_m_one_and_no_schedule(family, capsys):
    stare_overrides = method_overrides(parse_method_spec("stare"), STARE_DOSE)
    stare = compose_recipe(f"cpu/{family}_tiny_stare", PLACEHOLDERS + stare_overrides)
    assert (stare.algorithm.stare.reweight_w, stare.algorithm.stare.reweight_m) == (3.0, 0.5)
    for extra in ([], ["++algorithm.stare.adaptive=true", "algorithm.stare.reweight_w=1.2"]):
        twin_overrides = method_overrides(parse_method_spec("grpo"), STARE_DOSE + extra)
        twin = compose_recipe(f"cpu/{family}_tiny_grpo", PLACEHOLDERS + twin_overrides)
        st = twin.algorithm.stare
        assert (st.reweight_w, st.reweight_m, st.adaptive) == (1.0, 1.0, False)
        # the other keys follow the overrides: both methods log the same stare/* metrics against the same target
        assert (st.top_p_ratio, st.target_entropy) == (0.02, 0.09)
    assert "the GRPO-ds twin keeps W = M = 1; ignored for it: algorithm.stare.reweight_w=3.0" in capsys.readouterr().out
