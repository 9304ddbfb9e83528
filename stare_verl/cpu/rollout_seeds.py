"""Sampling seeds of the ``hf`` rollout that do not depend on which replica serves a request.

verl's load balancer sends each request to the replica with the fewest requests in flight, i.e. the routing
depends on timing (and on the number of replicas and nodes). A seed derived on the server (its replica's seed,
the prompt, how often that server saw the prompt) therefore changes with load. These seeds are derived from
the run's position instead:

1. in the trainer, before verl's agent-loop manager splits a batch across its workers, every row gets
   :func:`row_seeds` of (``rollout.seed``, ``global_steps``, validation or training, the how-many-th batch of
   that step and kind it is, the row's position in the batch);
2. in the agent-loop worker, each of a row's ``rollout.n`` sessions gets :func:`session_seed` of the row's seed
   and its session index, sent as the request's ``sampling_params["seed"]``;
3. on the server, each request draws from the stream :func:`request_stream_seed` of that seed and its prompt's
   token ids, so the turns of a multi-turn episode (which all carry the session's seed, each with a longer
   prompt) draw from distinct streams, and a given turn from the same one wherever it runs.

Every value is a 63-bit non-negative int (fits int64), a BLAKE2b digest of its inputs: equal inputs give equal
seeds on any machine and Python process (no ``hash()`` randomisation).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

SEED_KEY = "stare_rollout_seed"
"""Per-row column (int64 tensor) the trainer adds to the batch it hands verl's agent-loop manager; the agent-loop
worker takes it out of the row's fields before the agent loop runs (it never reaches TransferQueue)."""

_MASK63 = (1 << 63) - 1


def _digest63(*parts: bytes) -> int:
    h = hashlib.blake2b(digest_size=8, person=b"stare-seeds")
    for part in parts:
        h.update(struct.pack("<Q", len(part)))  # length-prefixed: no two part lists share a byte string
        h.update(part)
    return int.from_bytes(h.digest(), "little") & _MASK63


def _int(x: int) -> bytes:
    return str(int(x)).encode()


def row_seeds(base_seed: int, global_steps: int, validate: bool, submission: int, n_rows: int) -> list[int]:
    """The seeds of the rows of one batch handed to the agent-loop manager.

    Args:
        base_seed: ``actor_rollout_ref.rollout.seed``.
        global_steps: the trainer's step the batch is generated for (``global_steps`` of the batch).
        validate: a validation batch (its seeds never equal a training batch's).
        submission: how many batches of this ``(global_steps, validate)`` were handed over before this one in the
            same trainer process (validation loops over several batches at one step; the async trainers submit
            warm-up batches).
        n_rows: rows (prompts) in the batch.

    Returns:
        ``n_rows`` ints in ``[0, 2**63)``, row ``i`` a function of the five arguments and ``i`` only.
    """
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    head = (b"row", _int(base_seed), _int(global_steps), b"val" if validate else b"train", _int(submission))
    return [_digest63(*head, _int(i)) for i in range(n_rows)]


def session_seed(row_seed: int, session_id: int) -> int:
    """The seed of session ``session_id`` (0 .. ``rollout.n`` - 1) of a row: the ``seed`` of its requests.

    Returns:
        an int in ``[0, 2**63)``.
    """
    return _digest63(b"session", _int(row_seed), _int(session_id))


def request_stream_seed(seed: int, prompt_ids: Sequence[int]) -> int:
    """The random stream a request with an explicit ``seed`` draws from: a digest of the seed and its prompt's
    token ids (each as a little-endian int64), so two turns of one episode (same seed, different prompts) draw
    different samples, and the same request the same samples on any server.

    Returns:
        an int in ``[0, 2**63)``.
    """
    ids = struct.pack(f"<{len(prompt_ids)}q", *(int(t) for t in prompt_ids))
    return _digest63(b"request", _int(seed), ids)


__all__ = ["SEED_KEY", "row_seeds", "session_seed", "request_stream_seed"]
