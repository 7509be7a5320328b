"""``python -m coacto.server``: the ``coacto-server`` command (see ``coacto-server --help``)."""
import sys

from .cli import main

sys.exit(main())
