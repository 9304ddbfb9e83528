"""``python -m stare_verl.jobs.evaluation``: see :mod:`stare_verl.jobs.evaluation.cli`."""

import sys

from stare_verl.jobs.evaluation.cli import main

if __name__ == "__main__":
    sys.exit(main())
