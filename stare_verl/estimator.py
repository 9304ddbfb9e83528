"""The ``stare`` advantage estimator, registered in verl's advantage-estimator registry by :func:`register`
(called from ``stare_verl.plugin``).

verl's ``compute_advantage`` passes only rewards, mask, uid and config to registered estimators; STARE also
needs the pre-update policy's log-probs and entropy. The ``stare_*`` trainer modes (``stare_verl.trainer``)
call :func:`compute_stare_advantage` directly with them; any other caller (verl's own trainers through the
registry) gets a clear error instead of silent GRPO. verl is imported only inside the functions, so importing
this module never runs verl's plugin loader (and with it ``stare_verl.plugin``) half-way through this file.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from stare_verl.config import ConfigBoolError, StareConfigError, parse_stare_config, read_bool
from stare_verl.controller import StareController
from stare_verl.core import ZERO_VARIANCE_TOL, zero_variance_groups
from stare_verl.stare import stare_reweight

ESTIMATOR_NAME = "stare"
STARE_TRAINER_MODES = ("stare_sync", "stare_colocate_async")


class StareInputsMissing(RuntimeError):
    """The estimator was called without old log-probs / entropy, i.e. from a trainer that cannot feed it."""


def register() -> None:
    """Register :func:`compute_stare_advantage` as verl's advantage estimator ``stare`` (idempotent)."""
    from verl.trainer.ppo.core_algos import register_adv_est

    register_adv_est(ESTIMATOR_NAME)(compute_stare_advantage)


@dataclasses.dataclass(frozen=True)
class GroupConfig:
    """The settings of GRPO's group baseline (STARE step 1) for methods without a config of their own for it.

    Attributes:
        norm_adv_by_std_in_grpo: divide by the group std (GRPO) or not (Dr.GRPO); verl's key of that name.
        epsilon: added to the group std. zero_variance_tol: see ``StareConfig.zero_variance_tol``.
    """

    norm_adv_by_std_in_grpo: bool = True
    epsilon: float = 1e-6
    zero_variance_tol: float = ZERO_VARIANCE_TOL

    @classmethod
    def from_algorithm(cls, algorithm_config: Any) -> GroupConfig:
        """The baseline of verl's ``algorithm`` section: ``norm_adv_by_std_in_grpo`` read by the project's one
        boolean reader (``stare_verl.config.config_bool``: ``0`` and ``"false"`` are Dr.GRPO, as for STARE and
        verl), True when absent.

        Raises:
            StareConfigError: the key holds no boolean (``"maybe"``, ``2``, null), named in the message.
        """
        try:
            norm = read_bool(algorithm_config, "norm_adv_by_std_in_grpo", True, "algorithm")
        except ConfigBoolError as err:
            raise StareConfigError(str(err)) from None
        return cls(norm_adv_by_std_in_grpo=norm)


def group_baseline(algorithm_config: Any) -> GroupConfig:
    """The GRPO group baseline (STARE step 1) a run of verl's ``algorithm`` section computes its advantages from:
    for ``adv_estimator=stare`` (STARE and the methods run as its GRPO-ds twin) STARE's config
    (``algorithm.stare.norm_adv_by_std_in_grpo`` / ``epsilon`` / ``zero_variance_tol``, the first falling back to
    ``algorithm.norm_adv_by_std_in_grpo``), for the other estimators :meth:`GroupConfig.from_algorithm`. Two runs
    are comparable only when these are equal.

    Raises:
        StareConfigError: an invalid ``algorithm.stare`` or a boolean key that holds no boolean.
    """
    get = getattr(algorithm_config, "get", None)
    estimator = get("adv_estimator", None) if get else getattr(algorithm_config, "adv_estimator", None)
    if estimator == ESTIMATOR_NAME:
        c = parse_stare_config(algorithm_config)
        return GroupConfig(c.norm_adv_by_std_in_grpo is not False, c.epsilon, c.zero_variance_tol)
    return GroupConfig.from_algorithm(algorithm_config)


def grpo_base(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    algorithm_config: Any,
    metrics: dict,
    cfg: Any = None,
) -> torch.Tensor:
    """GRPO's advantage, the base every entropy-control method starts from (``[B, T]`` float, 0 where the mask is
    0): verl's ``grpo_vectorized`` bit for bit except for zero-variance groups and non-finite rewards (see
    :func:`_group_advantage`). ``cfg`` (``epsilon``, ``norm_adv_by_std_in_grpo``, ``zero_variance_tol``) defaults
    to :meth:`GroupConfig.from_algorithm`. Logs ``entropy_control/nonfinite_rewards`` (responses) and
    ``entropy_control/zero_variance_groups`` (share of groups) into ``metrics``.

    Raises:
        ValueError: ``index`` is None.
    """
    if index is None:
        raise ValueError("the advantage needs `index` (the group uid of each response)")
    cfg = cfg or GroupConfig.from_algorithm(algorithm_config)
    adv, n_bad, zero_var_share = _group_advantage(token_level_rewards, response_mask, index, cfg)
    metrics["entropy_control/nonfinite_rewards"] = float(n_bad)
    metrics["entropy_control/zero_variance_groups"] = zero_var_share
    return adv


def stare_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor,
    entropys: torch.Tensor,
    controller: StareController,
    metrics: dict,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """STARE steps 1-6: ``(grpo_advantages, omega * grpo_advantages)``, both ``[B, T]``; with ``inplace`` the first is
    the second's storage (overwritten: one ``[B, T]`` copy less, for callers that need only the second). Adds the
    ``stare/*`` metrics (see :func:`compute_stare_advantage`) to ``metrics``."""
    cfg = controller.config
    base, n_bad, zero_var_share = _group_advantage(token_level_rewards, response_mask, index, cfg)
    eff, step_metrics = stare_reweight(base, response_mask, old_log_probs, entropys, controller, inplace=inplace)
    step_metrics["stare/nonfinite_rewards"] = float(n_bad)
    step_metrics["stare/zero_variance_groups"] = zero_var_share
    metrics.update(step_metrics)
    return base, eff


def compute_stare_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    old_log_probs: torch.Tensor | None = None,
    entropys: torch.Tensor | None = None,
    controller: StareController | None = None,
    metrics: dict | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """STARE advantage: omega * GRPO advantage (STARE steps 1-6, ``docs/stare.md``).

    Args:
        token_level_rewards: ``[B, T]`` float; a response's outcome reward is its row sum.
        response_mask: ``[B, T]``, 1 for model-generated tokens, 0 for padding and tool output.
        index: ``[B]`` group ids (verl's ``uid``, any dtype verl accepts); grouped exactly as verl's
            ``grpo_vectorized`` groups them (:func:`verl_group_codes`: ``"1"`` and ``"01"`` are one group).
        config: verl's ``algorithm`` section; STARE keys under ``algorithm.stare`` (see ``StareConfig``).
        old_log_probs: ``[B, T]`` float log-probs (nats) of the pre-update policy.
        entropys: ``[B, T]`` float per-token entropy (nats) from the same forward pass.
        controller: gate/schedule state kept across steps; a fresh one (stateless behaviour) if None.
        metrics: if given, updated in place with the ``stare/*`` metrics.
        **kwargs: ignored (forward compatibility with verl's calling convention).

    Returns:
        ``(advantages, returns)``, both the same ``[B, T]`` float tensor, exactly 0 where the mask is 0.
        The base is verl's ``grpo_vectorized`` (GRPO or Dr.GRPO) bit for bit, except: a zero-variance group
        (all rewards equal up to float residue, ``zero_variance_tol``) gets exactly 0 where verl leaves a
        rounding residue whose sign would decide L+/L- (``stare/zero_variance_groups``: their share of the
        groups); a response whose outcome reward is NaN/inf gets 0 and stays out of its group's mean/std
        (``stare/nonfinite_rewards``). See ``_group_advantage``.

    Raises:
        StareInputsMissing: ``old_log_probs``/``entropys`` not given (a trainer mode other than ``stare_*``).
        StareConfigError: invalid ``algorithm.stare``.
        ValueError: ``index`` missing or shapes that do not match.
    """
    if old_log_probs is None or entropys is None:
        raise StareInputsMissing(
            "algorithm.adv_estimator=stare needs the old log-probs and entropy of each token, which this "
            "trainer does not pass to advantage estimators. Use trainer.v1.trainer_mode=stare_sync (or "
            "stare_colocate_async) from stare_verl, with trainer.use_v1=true."
        )
    if index is None:
        raise ValueError("the stare estimator needs `index` (the group uid of each response)")
    if controller is None:
        controller = StareController(parse_stare_config(config))
    step_metrics: dict = {}
    _, advantages = stare_advantages(token_level_rewards, response_mask, index, old_log_probs, entropys, controller,
                                     step_metrics, inplace=True)  # fmt: skip  # ours: no copy needed
    if metrics is not None:
        metrics.update(step_metrics)
    return advantages, advantages


_WARNED_MERGE = False


def verl_group_codes(index: Any) -> tuple[np.ndarray, int]:
    """Group codes of ``index`` exactly as verl's ``grpo_vectorized`` groups it: verl's own
    ``verl.utils.groupwise.as_torch_index`` (renumbered by first appearance), so the zero-variance and
    cut-group corrections below act on the groups verl's advantage was computed over.

    verl's rule is not Python equality: an array whose labels all read as integers is grouped by that integer
    (``"1"``, ``"01"``, ``" 1"``, ``"+1"``, ``1`` and ``True`` are one group; object floats are truncated, so
    ``1.2`` and ``1.7`` are one group too), numeric arrays by their near-integer value, anything else (UUID
    strings, mixed labels) by ``np.unique`` of the labels or of their ``str``. The grouping of a label depends on
    the whole array (``["1", "01"]`` is one group, ``["1", "01", "a"]`` two). When verl's rule merges labels that
    differ as Python values a warning says so once per process (two prompts then share a baseline, in verl's
    GRPO as in ours).

    Returns:
        ``(codes, n_groups)``: ``[B]`` int64 codes in ``0..n_groups-1``, numbered by first appearance.
    """
    global _WARNED_MERGE
    from verl.utils.groupwise import as_torch_index

    g = as_torch_index(index, device="cpu").numpy().reshape(-1)
    uniq, first, inv = np.unique(g, return_index=True, return_inverse=True)
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(uniq), dtype=np.int64)
    codes = rank[inv.reshape(-1)]
    if not _WARNED_MERGE:
        try:
            labels = index.tolist() if hasattr(index, "tolist") else list(index)
            distinct = len({(type(u).__name__, u) for u in labels})
        except TypeError:  # unhashable labels: nothing to compare
            distinct = len(uniq)
        if distinct > len(uniq):
            _WARNED_MERGE = True
            import logging

            logging.getLogger(__name__).warning(
                "verl groups %d distinct uid labels into %d groups (numeric strings such as '1' and '01', ints "
                "and bools, or object floats read as integers); STARE uses verl's grouping", distinct, len(uniq)
            )
    return codes, len(uniq)


def _group_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray, cfg: Any
) -> tuple[torch.Tensor, int, float]:
    """GRPO's advantage (STARE step 1), ``[B, T]`` float; the number of responses whose outcome reward (row sum)
    is NaN or +-inf; and the share of zero-variance groups.

    This is verl's ``grpo_vectorized`` (std-normalised, or Dr.GRPO with ``norm_adv_by_std_in_grpo=False``)
    with two deliberate differences, both only where verl's value is an artefact:

    - **Zero-variance groups** (the one place where finite rewards get a different advantage): a group whose
      rewards are all equal up to floating-point residue (``core.zero_variance_groups``,
      ``zero_variance_tol``) gets advantage exactly 0. verl's float32 mean leaves a residue there (8 rewards
      of 0.7 give +0.056 each), and its sign would decide whether the group's tokens enter L+ or L-.
      Everywhere else the advantage is verl's, bit for bit.
    - A non-finite reward (a broken reward function) would make its whole group's mean and std NaN and the
      loss NaN; instead such responses get advantage 0 and are left out of their group's statistics, which
      the finite responses of the group keep. A group left with a single finite response has no baseline: that
      response gets 0 too (not verl's singleton value A = r; groups of one from the start keep verl's value).
    """
    from verl.trainer.ppo.core_algos import compute_grpo_vectorized_outcome_advantage

    scores = token_level_rewards.sum(dim=-1)
    bad = ~torch.isfinite(scores)
    n_bad = int(bad.sum())
    # None (a StareConfig built by hand) means verl's default, std-normalised GRPO
    kw = {"epsilon": cfg.epsilon, "norm_adv_by_std_in_grpo": cfg.norm_adv_by_std_in_grpo is not False}
    codes, n_groups = verl_group_codes(index)  # verl's own grouping of these uids, used for every step below
    # verl's function sums its rewards along the row first: handed the row sums as [B, 1] it sums one entry per
    # row (the same value, bit for bit), so the [B, T] rewards are read once, here, not twice
    if n_bad == 0:
        adv, _ = compute_grpo_vectorized_outcome_advantage(scores[:, None], response_mask, index, **kw)
    else:
        adv = torch.zeros_like(token_level_rewards)
        keep = (~bad).nonzero(as_tuple=True)[0]
        if keep.numel():
            # the codes of the whole batch, not the subset's uids: verl's rule depends on the whole array
            # (["1", "01"] share a group, ["1", "01", "a"] do not), so the finite responses keep the batch's groups
            idx = codes[keep.cpu().numpy()]
            sub, _ = compute_grpo_vectorized_outcome_advantage(scores[keep][:, None], response_mask[keep], idx, **kw)
            adv[keep] = sub.to(adv.dtype)
    scores_np = scores.detach().double().cpu().numpy()
    if n_bad:
        # a group that non-finite rewards cut down to one finite response has no baseline left: verl's singleton
        # convention (A = r) would hand that response its raw reward as advantage, so it gets 0 instead
        finite = ~bad.cpu().numpy()
        left = np.bincount(codes[finite], minlength=n_groups)
        cut = (np.bincount(codes, minlength=n_groups) > 1) & (left == 1)
        cut_rows = cut[codes] & finite
        if cut_rows.any():
            adv[torch.from_numpy(cut_rows).to(adv.device)] = 0.0
    zero_var = zero_variance_groups(scores_np, codes, n_groups, ~bad.cpu().numpy(), cfg.zero_variance_tol)
    rows = zero_var[codes]
    if rows.any():
        # on the CPU through a NumPy view: a memset per row, not a torch index-put over [B, T]
        if adv.device.type == "cpu" and adv.dtype in (torch.float32, torch.float64):
            adv.numpy()[rows] = 0.0
        else:
            adv[torch.from_numpy(rows).to(adv.device)] = 0.0
    return adv, n_bad, float(np.count_nonzero(zero_var)) / max(n_groups, 1)
