"""What a user runs: training, comparison, SFT, evaluation, the CPU demo pipeline, run logs, the CLI.

The only layer that imports both the algorithm side (``stare_verl`` outside ``jobs``) and the
environments (``envs``); neither of those imports it (checked by ``make lint``).
"""
