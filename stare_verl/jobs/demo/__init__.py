"""The CPU defaults of the three families: a tiny model, its tokenizer, demonstrations, the cold-start SFT
(cached by configuration) and the held-out evaluation that runs before and after RL.

Families (``stare_verl.jobs.families``, one descriptor each): ``tooluse`` (reasoning-gym arithmetic solved with the
sandboxed Python tool, ``families.tooluse``), ``shortcot`` and ``longcot`` (reasoning-gym sums of 3-4 one-digit terms
solved as running sums in a sampled order, the long form inside a ``<think>`` block with a check pass,
``families.cot``). The model, tokenizer, SFT trainer, evaluation and RL-data code are shared and ask the family's
descriptor; ``SFTConfig.family`` / the ``family`` arguments select it.

Entry points:

- :func:`stare_verl.jobs.demo.sft.ensure_sft_checkpoint` -> the directory of a cold-start SFT checkpoint (model and
  tokenizer together, loadable with ``AutoModelForCausalLM`` / ``AutoTokenizer``), trained once per
  configuration and reused from the cache afterwards.
- :func:`stare_verl.jobs.families.problems.write_rl_parquet` -> verl RLHF parquet files (train / val) for RL on the same task.
- :func:`stare_verl.jobs.demo.evaluate.evaluate_checkpoint` -> held-out accuracy, turns and tool calls.
- ``python -m stare_verl.jobs.demo.sft [--family F] --out DIR [--steps N]``.

Numbers (model size, tokenizer, task mix, SFT batch / lr / steps) follow the measured calibration in
``docs/cpu-demo-calibration.md`` (tool use) and the measurements in ``sft.py`` (CoT families). Nothing
here downloads anything.
"""
