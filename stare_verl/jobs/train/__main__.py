"""``python -m stare_verl.jobs.train``: :func:`stare_verl.jobs.train.entry.main`."""

import sys

from stare_verl.jobs.train.entry import main

sys.exit(main())
