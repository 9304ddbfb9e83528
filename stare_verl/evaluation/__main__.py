"""``python -m stare_verl.evaluation``: see :mod:`stare_verl.evaluation.cli`."""

import sys

from stare_verl.evaluation.cli import main

if __name__ == "__main__":
    sys.exit(main())
