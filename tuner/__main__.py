"""`python -m tuner`: the `tune` command, whichever package owns the `tune` script on PATH."""
import sys

from tuner.cli import main

sys.exit(main())
