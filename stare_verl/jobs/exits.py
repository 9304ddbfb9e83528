"""The exit statuses every ``stare-verl`` command shares (``train``, ``compare``, ``sft``, ``eval``, ``check``,
``plot``, ``methods`` and the ``python -m`` entry points), so that a script can tell a refused command from a run
that failed:

- ``0``: done.
- ``2`` (:data:`USAGE_ERROR`): the command was refused before it ran: an unknown flag or a value of the wrong type
  (argparse's own status), a bad option, override or recipe, an input file that is missing or malformed, results
  on disk that do not match the settings. One line on stderr says why; nothing was trained and nothing lost.
- ``1`` (:data:`RUN_FAILED`): the command started and failed: verl's trainer, a server that cannot be reached, the
  sandbox, a trained checkpoint below a required accuracy. Its line says what ran and what is kept.
- ``124`` (:data:`STALLED`): a run the job stopped because it made no progress (``STARE_STALL_TIMEOUT_S``; as
  ``timeout(1)`` reports one).
- ``130`` (:data:`INTERRUPTED`): Ctrl-C, SIGTERM or a closed terminal (128 + SIGINT, as a shell reports it); what
  was written is kept for a resume.
"""

USAGE_ERROR = 2
RUN_FAILED = 1
STALLED = 124
INTERRUPTED = 130
