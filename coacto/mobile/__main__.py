"""``python -m coacto.mobile``: the ``coacto-client`` command (see ``coacto-client --help``)."""
import sys

from .cli import main

sys.exit(main())
