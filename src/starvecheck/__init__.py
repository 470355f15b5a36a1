"""starvecheck: why is my GPU waiting, and what do I change first?"""

__version__ = "0.1.0"
