"""starvecheck's version, in the vocabulary layer: advice stamps it in a report, the CLI
prints it, and neither imports the package root (which carries the public API)."""

__version__ = "0.1.0"
