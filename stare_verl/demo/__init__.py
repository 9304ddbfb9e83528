"""The CPU default of the tool-use family: a tiny model, its tokenizer, tool-use demonstrations, the cold-start
SFT (cached by configuration) and the held-out evaluation that runs before and after RL.

Entry points:

- :func:`stare_verl.demo.sft.ensure_sft_checkpoint` -> the directory of a cold-start SFT checkpoint (model and
  tokenizer together, loadable with ``AutoModelForCausalLM`` / ``AutoTokenizer``), trained once per
  configuration and reused from the cache afterwards.
- :func:`stare_verl.demo.demos.write_rl_parquet` -> verl RLHF parquet files (train / val) for RL on the same task.
- :func:`stare_verl.demo.evaluate.evaluate_checkpoint` -> held-out accuracy, turns and tool calls.
- ``python -m stare_verl.demo.sft --out DIR [--steps N]``.

Numbers (model size, tokenizer, task mix, SFT batch / lr / steps) follow the measured calibration in
``shared/specs/cpu-demo-calibration.md``. Nothing here downloads anything.
"""
