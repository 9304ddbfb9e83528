"""``python -m stare_verl.jobs.demo.evaluate``: bad values are usage errors (exit 2, one line), never a traceback
or a silently different evaluation (``--n -1`` used to evaluate 199 problems through a slice)."""

import pytest

from stare_verl.jobs.demo.evaluate import main


@pytest.mark.parametrize("argv, message", [
    (["{missing}"], "is not a checkpoint folder"),
    (["{ckpt}", "--n", "-1"], "--n must be >= 1 (got -1)"),
    (["{ckpt}", "--n", "0"], "--n must be >= 1 (got 0)"),
    (["{ckpt}", "--n-heldout", "0", "--data-seed", "0"], "--n-heldout must be >= 1 (got 0)"),
    (["{ckpt}", "--temperatures", "nan"], "--temperatures must be finite and >= 0"),
    (["{ckpt}", "--temperatures", "0", "-1"], "--temperatures must be finite and >= 0"),
    (["{ckpt}"], "has no sft_config.json: give data_seed and n_heldout"),  # an RL export without its SFT config
])  # fmt: skip
def test_bad_values_are_usage_errors(argv, message, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    argv = [a.format(missing=tmp_path / "nope", ckpt=ckpt) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
