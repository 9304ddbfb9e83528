"""``make train-tooluse`` / ``train-shortcot`` / ``train-longcot``: STARE RL, verl on this CPU by default, verl +
SGLang on a GPU node.

CPU default (no GPU, or ``--cpu``; :mod:`.cpu`): the cached cold-start SFT checkpoint of the family's tiny model
(``stare_verl.jobs.demo.sft.ensure_sft_checkpoint``, trained on first use), RL data from reasoning-gym, a held-out
evaluation (:mod:`.heldout`), then ``python -m verl.trainer.main_ppo`` (:mod:`.launch`) with
``recipes/cpu/<family>_tiny_<method>.yaml`` (verl's V1 trainer, ``stare_sync``, the ``hf`` rollout backend; tool
use: ``stare_tool_agent``, the sandboxed code_interpreter and ``envs.tool_use.task.compute_score``; short / long
CoT: verl's ``single_turn_agent``, no tool, ``envs.reward.compute_score``), then the held-out evaluation again.
``--model`` trains a pretrained model on its family's pretrained task instead (:mod:`stare_verl.jobs.pretrained`).
The run folder (``runs/<family>-<method>-seed<seed>`` under the working directory, or ``RUN_DIR``) holds
``metrics.jsonl``, ``checkpoints/`` (verl's; a second invocation resumes from them), ``plots/*.png``
(``plots/dashboard.png``: every curve in one figure, as ``stare-verl plot`` draws it),
``eval_before.json``/``eval_after.json``, ``summary.json`` and ``train.log``.

GPU (an NVIDIA GPU; never a silent CPU fallback, see ``stare_verl.jobs.backend``): with SGLang installed,
``main_ppo`` with the family's recipe under ``recipes/`` (:mod:`.gpu`; ``MODEL=...`` and extra Hydra overrides
passed through); without SGLang, the tiny recipe above on verl's CUDA platform (``trainer.device=cuda``), from
``MODEL=...`` when set (any Hugging Face causal LM that fits; no SFT and no held-out evaluation then) or else from
the tiny model's SFT checkpoint. The console's second line, the first line of ``train.log`` and
``summary.json["backend"]`` say which rollout backend, platform, device and sandbox backend ran; verl's import-time
warnings go to ``train.log`` only, each warning line once (:mod:`stare_verl.jobs.logfilter`).

``--dry-run`` (:mod:`.plan`; any machine, no CUDA): the backend it would choose and why, the exact ``main_ppo``
command and the composed config, validated as verl would at launch; nothing is trained, downloaded, written or
launched. ``--gpu`` (or ``MODEL=...``) plans the GPU recipe there even without a GPU.

The options (:mod:`.options`): :class:`TrainOptions`, typed and checked, with the command line and ``--help``
generated from its fields; :mod:`.engine`: the rollout engine and placement; :mod:`.entry`: ``main``.
"""

from stare_verl.jobs.train.cpu import (
    HELDOUT_POINTS,
    heldout_save_freq,
    is_pretrained_recipe,
    tiny_recipe_command,
    tiny_run_dir,
    train_cpu,
)
from stare_verl.jobs.train.engine import engine_mismatch, model_problem, rollout_engine, with_rollout
from stare_verl.jobs.train.entry import main
from stare_verl.jobs.train.gpu import CPU_ONLY_OPTIONS, train_gpu
from stare_verl.jobs.train.heldout import cached_eval_before, evaluate_sft_cached, heldout_entropy_curve
from stare_verl.jobs.train.launch import (
    INTERRUPTED,
    method_overrides,
    resume_clause,
    run_env,
    run_main_ppo,
    stopped_before_rl,
)
from stare_verl.jobs.train.options import (
    SFT_OPTIONS,
    SFT_SHARED_OPTIONS,
    TINY_DEFAULTS,
    WARM_START_STEPS,
    OptionsError,
    TrainOptions,
    add_options,
    bad_option,
    build_parser,
    parse_options,
)
from stare_verl.jobs.train.plan import dry_run

__all__ = ["CPU_ONLY_OPTIONS", "HELDOUT_POINTS", "INTERRUPTED", "SFT_OPTIONS", "SFT_SHARED_OPTIONS", "TINY_DEFAULTS",
           "WARM_START_STEPS", "OptionsError", "TrainOptions", "add_options", "bad_option", "build_parser",
           "cached_eval_before", "dry_run", "engine_mismatch", "evaluate_sft_cached", "heldout_entropy_curve",
           "heldout_save_freq", "is_pretrained_recipe", "main", "method_overrides", "model_problem",
           "parse_options", "resume_clause", "rollout_engine", "run_env", "run_main_ppo", "stopped_before_rl",
           "tiny_recipe_command", "tiny_run_dir", "train_cpu", "train_gpu", "with_rollout"]  # fmt: skip
