"""The command line: `main` runs it (see cli/main.py); one module per command,
cli/common.py for what they share."""

from starvecheck.cli.main import main

__all__ = ["main"]
