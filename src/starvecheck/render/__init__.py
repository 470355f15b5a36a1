"""Showing: renderers and exporters read results and never measure.

Each exporter is a pure `serialize(report) -> str`; the terminal renderer writes
to a rich Console it is given.
"""
