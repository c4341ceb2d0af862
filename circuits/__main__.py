"""``python -m circuits``: the ``circuits`` command line (see ``circuits.cli.commands``)."""

import sys

from circuits.cli import main

sys.exit(main())
