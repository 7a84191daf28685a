"""``python -m lazyxla <command>``: the command line of ``lazyxla.cli``."""
import sys

from .cli import main

sys.exit(main())
