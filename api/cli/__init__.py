"""The `shardline` command line: the typer app (app.py) and one module per command group.

Its local commands (train, generate, export) may import the engine; the rest speak HTTP.
"""

from shardline.api.cli.app import app, main

__all__ = ["app", "main"]
