"""``python -m verbmirage``: the same as the ``verbmirage`` command (:mod:`verbmirage.workflow.cli`)."""

import sys

from verbmirage.workflow.cli import main

if __name__ == "__main__":
    sys.exit(main())
