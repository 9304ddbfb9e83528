"""The CoT families (``short_cot``, ``long_cot``): no code of their own.

They are the shared pieces with a family preset: rows from ``envs.datasets`` (``--family short_cot|long_cot``,
prompts in ``envs.prompts``), scored by ``envs.reward.compute_score`` (``reward_kwargs.family``; long CoT
requires the ``<think>`` block), with verl's ``single_turn_agent``.
"""
