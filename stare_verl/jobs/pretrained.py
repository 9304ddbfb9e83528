"""RL of a pretrained model on the CPU (``--model NAME|PATH``): the family's pretrained task, the model's own
tokenizer and chat template, verl's trainer with the ``hf`` (or vLLM) rollout, the held-out evaluation before and
after, and the same run folder as the tiny model's runs.

The model is a registered name (``stare_verl.models``, prepared offline by ``make model``) or any local Hugging Face
folder. The family's :class:`stare_verl.jobs.families.base.PretrainedTask` says which problems (chosen so that the
model starts between roughly 10% and 60% correct), how they are scored and which recipe trains
(``recipes/cpu/<family>_real_<method>.yaml``). No cold-start SFT runs when the task needs none.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stare_verl.jobs.families.base import JobFamily
from stare_verl.models import ResolvedModel

DATA_SEED = 0
"""The data seed of the pretrained tasks' problems (held-out split first, then RL's training split)."""
N_HELDOUT = 200
"""Held-out problems drawn for a pretrained task; ``--n-eval`` evaluates the first of them."""


@dataclass(frozen=True)
class PretrainedRun:
    """What a pretrained model's run needs besides the options: the family's pretrained variant, the model, and where
    caches go.

    Attributes:
        family: ``job_family(name).for_pretrained()``.
        model: the resolved ``--model``.
        cache_dir: the run's cache folder (the vLLM engine's compile cache, the warm-started models).
        n_sft_train: problems of the warm start's split (0: none), left out of RL's training split.
    """

    family: JobFamily
    model: ResolvedModel
    cache_dir: Path
    n_sft_train: int = 0

    @classmethod
    def of(cls, model: str | None, family: JobFamily, cache_dir: str | None = None, planned: bool = False
           ) -> PretrainedRun | None:  # fmt: skip
        """The run of ``model`` (``--model``; None for the tiny model, the default) on ``family`` (``--family``), its
        caches under ``cache_dir`` (``--sft-cache``), ``$STARE_CACHE_DIR`` or ``runs/cache``. ``planned`` (the dry
        run): a registered model that is not prepared yet still plans (its folder is where ``make model`` puts it).

        Raises:
            ValueError: (``stare_verl.models.ModelError`` included) an unknown name that is no model folder, a
                folder whose weights cannot be loaded, a registered model not prepared yet or whose prepared weights
                are damaged (unless ``planned``), or a family without a pretrained task.
        """
        from stare_verl.jobs.demo.sft import DEFAULT_CACHE_DIR
        from stare_verl.models import ModelError, lookup, resolve_model

        if model in (None, "tiny") or resolve_model(model, require_prepared=False).is_tiny:
            return None
        variant = family.for_pretrained()  # a family without a pretrained task says so before the model is looked at
        try:
            resolved = resolve_model(model)
        except ModelError:
            if not (planned and lookup(model) is not None):
                raise
            return cls(family=variant, model=resolve_model(model, require_prepared=False), cache_dir=Path("."))
        cache = Path(cache_dir or os.environ.get("STARE_CACHE_DIR") or DEFAULT_CACHE_DIR)
        return cls(family=variant, model=resolved, cache_dir=cache)

    @property
    def needs_warm_start(self) -> bool:
        """Whether the family's pretrained task asks for a warm start on its demonstrations before RL."""
        return bool(self.family.pretrained is not None and self.family.pretrained.sft_warm_start)

    def warm_start(self, steps: int, lr: float = 3e-5, n_demos: int = 256, num_threads: int | None = None
                   ) -> tuple[PretrainedRun, Path]:  # fmt: skip
        """The warm-started model folder (``stare_verl.jobs.demo.warm_start.ensure_warm_start``: cached by the model
        and the settings) and this run with its demonstrations' split left out of RL's problems.

        Raises:
            ValueError: ``steps`` below 1 or no demonstration; DemoError: the sandbox failed.
        """
        from dataclasses import replace

        from stare_verl.jobs.demo.warm_start import WarmStartConfig, ensure_warm_start

        cfg = WarmStartConfig(model_dir=str(self.model.path), family=self.family.name, steps=steps, lr=lr,
                              n_demos=n_demos, data_seed=DATA_SEED, n_heldout=N_HELDOUT, num_threads=num_threads,
                              cache_dir=str(self.cache_dir))  # fmt: skip
        return replace(self, n_sft_train=n_demos), ensure_warm_start(cfg)

    def write_data(self, out_dir: Path, n_train: int, n_val: int) -> dict[str, Path]:
        """``train.parquet`` / ``val.parquet`` of the pretrained task (``n_train`` RL problems, the first ``n_val``
        held-out ones; disjoint). Raises ValueError for counts below 1 or ``n_val`` over :data:`N_HELDOUT`."""
        from stare_verl.jobs.families.problems import write_rl_parquet

        return write_rl_parquet(out_dir, n_train=n_train, n_val=n_val, seed=DATA_SEED, n_sft_train=self.n_sft_train,
                                n_heldout=N_HELDOUT, family=self.family)  # fmt: skip

    def evaluate(self, path: Path, n: int, samples: int) -> dict[str, Any]:
        """Held-out accuracy of the model folder ``path`` on the first ``n`` held-out problems: greedy and T = 1
        (``samples`` per problem, pass@k when more than one), as ``{"T=0": report, "T=1": report}``."""
        from stare_verl.jobs.demo.evaluate import evaluate_checkpoint

        reports = evaluate_checkpoint(path, n=n, data_seed=DATA_SEED, n_heldout=N_HELDOUT, family=self.family,
                                      samples=samples, max_response_tokens=128)  # fmt: skip
        return {f"T={t:g}": rep.to_dict() for t, rep in reports.items()}

    def describe(self) -> dict[str, Any]:
        """The model's entry for ``summary.json``."""
        return {"spec": self.model.spec, "name": self.model.name, "path": str(self.model.path),
                "registered": self.model.entry is not None}  # fmt: skip


PRETRAINED_DEFAULTS = {"steps": 20, "n_eval": 100, "eval_samples": 4, "n_train": 512}
"""The defaults of a ``--model`` run where the user gave none: 20 RL steps, 100 held-out problems, 4 samples per
held-out problem at T = 1 (avg@4, pass@4), 512 RL problems."""
