"""``python -m verbmirage``: the same as the ``verbmirage`` command (:mod:`verbmirage.cli`)."""

import sys

from verbmirage.cli import main

if __name__ == "__main__":
    sys.exit(main())
