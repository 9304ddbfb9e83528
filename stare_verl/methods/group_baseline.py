"""GRPO's group baseline, the advantage every entropy-control method starts from (STARE step 1, ``docs/stare.md``):
verl's ``grpo_vectorized`` with exact zeros for zero-variance groups and without the effect of non-finite rewards.

verl is imported only inside the functions, so importing this module never runs verl's plugin loader (and with it
``stare_verl.plugin``) half-way through it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from stare_verl.methods.settings import ConfigBoolError, MethodConfigError, read_bool

ZERO_VARIANCE_TOL = 1e-5
"""Default ``algorithm.stare.zero_variance_tol``: see :func:`zero_variance_groups`."""


def group_codes(index) -> tuple[np.ndarray, int]:
    """Map group labels (any hashable) to contiguous codes, by Python equality.

    This is not verl's grouping rule (verl reads ``"1"`` and ``"01"`` as one group, see
    verl_group_codes, which the baseline uses); it serves callers that own their labels.

    Args:
        index: ``[B]`` array-like of hashable labels; responses of one prompt share a label.

    Returns:
        ``(codes, n_groups)``: ``[B]`` int64 codes in ``0..n_groups-1``, numbered by first appearance.
    """
    lookup: dict = {}
    labels = index.tolist() if hasattr(index, "tolist") else list(index)
    codes = np.array([lookup.setdefault(u, len(lookup)) for u in labels], dtype=np.int64)
    return codes, len(lookup)


def zero_variance_groups(
    scores: np.ndarray, codes: np.ndarray, n_groups: int, finite: np.ndarray, tol: float = ZERO_VARIANCE_TOL
) -> np.ndarray:
    """Groups whose outcome rewards are all equal, up to floating-point residue: ``[n_groups]`` bool.

    A group of two or more responses with finite rewards is zero-variance when

        ``max_i r_i - min_i r_i <= tol * max(1, max_i |r_i|)``

    over its finite rewards (absolute on the usual reward scale |r| <= 1, relative beyond). Its GRPO advantage
    ``(r_i - mean) / (std + eps)`` is 0 in exact arithmetic, but verl's ``grpo_vectorized`` computes the mean
    as a float32 sum / count, which leaves a residue (8 copies of 0.7 give advantages of +0.056, Dr.GRPO
    +6e-8) whose sign would put the group's tokens into L+ or L- (STARE step 4 selects by surprisal among
    A > 0, whatever |A|). The caller sets such groups' advantage to exactly 0 (STARE step 1 as written:
    no reward difference, no advantage).

    Why a tolerance rather than exact equality: rewards reach verl through Python float64 and a float32
    tensor, and one reward can be written several ways (``0.1 + 0.2`` vs ``0.3``, a format bonus added before
    or after a penalty, per-turn rewards summed along the row in float32). Such values differ by a few
    float32 ulps (1 ulp of 1.0 is 1.2e-7); ``tol = 1e-5`` (about 80 ulps of 1) covers sums and differences of
    components up to ~10x the result, and is far below any difference a verifier is designed to express.
    ``tol = 0`` gives exact equality of the float32 rewards.

    Singleton groups (one finite reward) are not zero-variance: verl's convention (mean 0, std 1, so
    A = r) is kept. A group with no finite reward is not zero-variance either (its responses get 0 anyway).

    Args:
        scores: ``[B]`` float outcome rewards (row sums of the token-level rewards); non-finite entries ignored.
        codes: ``[B]`` int group codes in ``0..n_groups-1`` (see :func:`group_codes`).
        n_groups: number of groups.
        finite: ``[B]`` bool, the rewards to use (``np.isfinite(scores)``).
        tol: tolerance as above (>= 0).

    Raises:
        ValueError: ``scores``, ``codes`` and ``finite`` are not 1-D of one length, or ``tol < 0``.
    """
    if scores.ndim != 1 or codes.shape != scores.shape or finite.shape != scores.shape:
        raise ValueError(f"scores/codes/finite must be [B]: {scores.shape}, {codes.shape}, {finite.shape}")
    if not tol >= 0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    r = scores[finite].astype(np.float64)
    c = codes[finite]
    hi = np.full(n_groups, -np.inf)
    lo = np.full(n_groups, np.inf)
    np.maximum.at(hi, c, r)
    np.minimum.at(lo, c, r)
    count = np.bincount(c, minlength=n_groups)
    with np.errstate(invalid="ignore"):
        scale = np.maximum(1.0, np.maximum(np.abs(hi), np.abs(lo)))
        return (count >= 2) & (hi - lo <= tol * scale)


@dataclasses.dataclass(frozen=True)
class GroupConfig:
    """The settings of GRPO's group baseline (STARE step 1) for methods without a config of their own for it.

    Attributes:
        norm_adv_by_std_in_grpo: divide by the group std (GRPO) or not (Dr.GRPO); verl's key of that name.
        epsilon: added to the group std. zero_variance_tol: see :func:`zero_variance_groups`.
    """

    norm_adv_by_std_in_grpo: bool = True
    epsilon: float = 1e-6
    zero_variance_tol: float = ZERO_VARIANCE_TOL

    @classmethod
    def from_algorithm(cls, algorithm_config: Any) -> GroupConfig:
        """The baseline of verl's ``algorithm`` section: ``norm_adv_by_std_in_grpo`` read by the project's one
        boolean reader (:func:`stare_verl.methods.settings.config_bool`: ``0`` and ``"false"`` are Dr.GRPO, as
        for STARE and verl), True when absent.

        Raises:
            MethodConfigError: the key holds no boolean (``"maybe"``, ``2``, null), named in the message.
        """
        try:
            norm = read_bool(algorithm_config, "norm_adv_by_std_in_grpo", True, "algorithm")
        except ConfigBoolError as err:
            raise MethodConfigError(str(err)) from None
        return cls(norm_adv_by_std_in_grpo=norm)


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
    :func:`group_advantage`). ``cfg`` (``epsilon``, ``norm_adv_by_std_in_grpo``, ``zero_variance_tol``) defaults
    to :meth:`GroupConfig.from_algorithm`. Logs ``entropy_control/nonfinite_rewards`` (responses) and
    ``entropy_control/zero_variance_groups`` (share of groups) into ``metrics``.

    Raises:
        ValueError: ``index`` is None.
    """
    if index is None:
        raise ValueError("the advantage needs `index` (the group uid of each response)")
    cfg = cfg or GroupConfig.from_algorithm(algorithm_config)
    adv, n_bad, zero_var_share = group_advantage(token_level_rewards, response_mask, index, cfg)
    metrics["entropy_control/nonfinite_rewards"] = float(n_bad)
    metrics["entropy_control/zero_variance_groups"] = zero_var_share
    return adv


_WARNED_MERGE = False


def _string_label_codes(index: Any) -> tuple[np.ndarray, int] | None:
    """:func:`verl_group_codes` of the labels verl's trainer gives (``uid``: a 1-D object array of strings that do
    not all read as integers), without verl's sort of the strings; None for any other ``index``.

    verl tries to read the whole array as integers and, when one label does not read as one, factorises the
    strings with ``np.unique``: one group per distinct string, which is what numbering the strings by first
    appearance gives. Its reading as integers is tried here exactly as verl tries it (``astype(np.int64)``);
    where it succeeds verl's own function decides.
    """
    if not (isinstance(index, np.ndarray) and index.dtype == object and index.ndim == 1):
        return None
    labels = index.tolist()
    if not all(type(u) is str for u in labels):
        return None
    try:
        index.astype(np.int64)
    except Exception:  # noqa: BLE001 - verl catches every exception here too
        pass  # as in verl: not integers, so the strings are factorised
    else:
        return None
    lookup: dict = {}
    codes = np.fromiter((lookup.setdefault(u, len(lookup)) for u in labels), dtype=np.int64, count=len(labels))
    return codes, len(lookup)


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
    fast = _string_label_codes(index)
    if fast is not None:
        return fast
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
                "and bools, or object floats read as integers); the group baseline uses verl's grouping", distinct,
                len(uniq),
            )
    return codes, len(uniq)


def group_row_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray, cfg: Any
) -> tuple[torch.Tensor, float] | None:
    """:func:`group_advantage` per response: ``(row_advantages, zero_variance_share)`` with ``row_advantages``
    ``[B]`` such that ``row_advantages[:, None] * response_mask`` (torch) is :func:`group_advantage`'s ``[B, T]``
    result exactly (for finite mask values), in its dtype (verl's scalars promoted with the mask's dtype);
    zero-variance groups' rows are 0.

    Returns None when some outcome reward is NaN/inf (:func:`group_advantage` handles those rows, whose advantage
    is 0 whatever the mask, and a dtype that depends on it): the caller falls back to :func:`group_advantage`.
    """
    scores = token_level_rewards.sum(dim=-1)
    # verl computes the group statistics in float32 and the advantage in the rewards' dtype promoted with float32
    # (float64 stays float64; float16, bfloat16 and integer row sums become float32, as torch converts them)
    dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    scores_np = scores.detach().to(dtype).cpu().numpy()
    if not np.isfinite(scores_np).all():  # [B] on the host anyway: no torch reduction of its own
        return None
    from stare_verl.methods.group_kernels import group_moments, group_row_advantages

    codes, n_groups = verl_group_codes(index)
    count, mean, var, zero = group_moments(scores_np, codes, n_groups, float(cfg.zero_variance_tol))
    std = torch.sqrt(torch.clamp(torch.from_numpy(var), min=0.0)).numpy()  # torch's sqrt, as verl's
    out = np.empty_like(scores_np)
    group_row_advantages(scores_np, codes, count, mean, std, zero, np.float32(cfg.epsilon),
                         cfg.norm_adv_by_std_in_grpo is not False, out)  # fmt: skip
    n_zero = int(np.count_nonzero(zero))
    # verl's [B, T] result is scalars[:, None] * response_mask: the scalars promoted with the mask's dtype (x * 1 is
    # exact, so the promotion is the whole difference)
    row = torch.from_numpy(out).to(device=response_mask.device, dtype=torch.promote_types(dtype, response_mask.dtype))
    return row, float(n_zero) / max(n_groups, 1)


def group_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray, cfg: Any
) -> tuple[torch.Tensor, int, float]:
    """GRPO's advantage (STARE step 1), ``[B, T]`` float; the number of responses whose outcome reward (row sum)
    is NaN or +-inf; and the share of zero-variance groups.

    This is verl's ``grpo_vectorized`` (std-normalised, or Dr.GRPO with ``norm_adv_by_std_in_grpo=False``)
    with two deliberate differences, both only where verl's value is an artefact:

    - **Zero-variance groups** (the one place where finite rewards get a different advantage): a group whose
      rewards are all equal up to floating-point residue (:func:`zero_variance_groups`,
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
