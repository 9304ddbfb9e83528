"""Evaluation: avg@k and pass@k of a model on the project's datasets (AIME24/25, MATH-500, the tool-use task).

Against any OpenAI-compatible chat-completions server (SGLang, vLLM) with the training scorer, the training
loop's tool-call handling and the real sandbox; or, without a server, a local checkpoint on CPU.

Modules: ``episode`` (the one episode driver over a ``generate`` function, and the one record schema
``EvalRecord``), ``metrics`` (pass@k estimator, avg@k), ``client`` (async httpx client), ``settings`` (sampling
and episode settings, seeds), ``data`` (the dataset, checked), ``tools`` (the tool config and runner), ``chat`` (the
chat client's ``generate``), ``results`` (JSONL with resume), ``runner`` (the run against a server; every name of
the pieces above importable from it), ``engine`` (the local engine's ``generate``), ``summary`` (table and JSON),
``local`` (CPU checkpoint), ``cli`` (``python -m stare_verl.jobs.evaluation``; :func:`main`).
"""

from stare_verl.jobs.evaluation.cli import main
from stare_verl.jobs.evaluation.metrics import avg_at_k, pass_at_k

__all__ = ["avg_at_k", "main", "pass_at_k"]
