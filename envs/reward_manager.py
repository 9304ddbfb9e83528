"""A verl reward manager that tells ``envs.reward.compute_score`` the response length and whether EOS was hit.

verl's ``naive`` manager calls the custom reward function with the decoded text only, so the DAPO
overlong penalty and the truncation rule of ``compute_score`` have no token counts to work with.
``MathRewardManager`` is the naive manager plus, per response, in ``extra_info`` (set only when absent,
and an agent loop's ``extra_fields`` still override them, as verl merges those afterwards):

    response_length   valid response tokens (the agent loop should provide the model-token count for
                      multi-turn episodes, where tool tokens are part of the response)
    hit_eos           False only when the last valid token is not an end token *and* the response
                      reached the rollout limit (``actor_rollout_ref.rollout.response_length``)
    reward_options.max_response_length   the rollout limit (``reward_kwargs`` still win)

End tokens: the tokenizer's ``eos_token_id`` and, where in the vocabulary, the agent loop's turn-ending
tokens (``envs.contract.END_OF_TURN_TOKENS``).

Recipe wiring::

    reward:
      reward_manager: {source: importlib, name: MathRewardManager, module: {path: envs/reward_manager.py}}
      custom_reward_function: {path: envs/reward.py, name: compute_score}
"""

from __future__ import annotations

import copy
import logging

import numpy as np
from verl import DataProto
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager

from envs.contract import END_OF_TURN_TOKENS

__all__ = ["END_TOKENS", "MathRewardManager"]

logger = logging.getLogger(__name__)

END_TOKENS = END_OF_TURN_TOKENS


def _end_token_ids(tokenizer) -> set[int]:
    ids: set[int] = set()
    eos = getattr(tokenizer, "eos_token_id", None)
    for x in eos if isinstance(eos, (list, tuple)) else [eos]:
        if isinstance(x, int):
            ids.add(x)
    vocab = {}
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without get_vocab: eos only
        pass
    for tok in END_TOKENS:
        if tok in vocab:
            ids.add(int(vocab[tok]))
    return ids


def _rollout_limit(config) -> int | None:
    try:
        v = config.actor_rollout_ref.rollout.response_length
        return int(v) if v else None
    except Exception:  # noqa: BLE001 - no rollout section (tests, custom configs)
        return None


class MathRewardManager(NaiveRewardManager):
    """verl's naive reward manager plus ``response_length`` / ``hit_eos`` in ``extra_info`` (see module doc)."""

    def __init__(self, config, tokenizer, compute_score, reward_router_address=None, reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score, reward_router_address, reward_model_tokenizer)
        self.end_ids = _end_token_ids(tokenizer)
        self.max_response_length = _rollout_limit(config)

    def response_info(self, data: DataProto) -> dict:
        """``response_length``/``hit_eos``/``reward_options`` for the last sequence of ``data``."""
        item = data[-1]
        responses = item.batch["responses"]
        n = int(item.batch["attention_mask"][-responses.shape[-1] :].sum())
        last = int(responses[n - 1]) if n > 0 else None
        ended = last is not None and last in self.end_ids
        at_limit = self.max_response_length is not None and n >= self.max_response_length
        info = {"response_length": n, "hit_eos": bool(ended or not at_limit)}
        if self.max_response_length is not None:
            info["reward_options"] = {"max_response_length": self.max_response_length}
        return info

    async def run_single(self, data: DataProto) -> dict:
        data = data[-1:]
        extra = data.non_tensor_batch.get("extra_info")
        base = extra[0] if extra is not None and isinstance(extra[0], dict) else {}
        merged = copy.copy(base)  # extra_info dicts may be shared between the n rollouts of a prompt
        for k, v in self.response_info(data).items():
            if k == "reward_options":
                ro = dict(merged.get("reward_options") or {})
                for ok, ov in v.items():
                    ro.setdefault(ok, ov)
                merged["reward_options"] = ro
            else:
                merged.setdefault(k, v)
        arr = np.empty(1, dtype=object)
        arr[0] = merged
        data.non_tensor_batch["extra_info"] = arr
        return await super().run_single(data)
