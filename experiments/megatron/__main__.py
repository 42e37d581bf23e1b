"""`python -m experiments.megatron` (see cli.py)."""
import sys

from experiments.megatron.cli import main

if __name__ == "__main__":  # spawned workers import this module as __mp_main__: they must not run the CLI
    sys.exit(main())
