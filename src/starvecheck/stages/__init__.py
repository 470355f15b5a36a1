"""Stages measure one link each and return results; they never print."""
