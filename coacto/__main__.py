"""``python -m coacto``: the ``coacto`` command (see ``coacto --help``)."""
import sys

from .cli import main

sys.exit(main())
