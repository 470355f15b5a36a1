"""starvecheck: why is my GPU waiting, and what do I change first?"""

__version__ = "0.1.0"


def entry() -> int:
    """The console script. Importing the CLI (typer, rich) takes ~0.2 s; a Ctrl-C in
    that time is one line and exit 130, as it is once `cli.main` runs."""
    import sys

    try:
        from starvecheck.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("starvecheck: error: interrupted\n")
        return 130
    return main()
