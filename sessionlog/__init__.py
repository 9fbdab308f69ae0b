"""The `sessionlog` command line: thin wrappers over `sessions` and `replay`.

Composes every layer and is imported by none of them. `sessionlog.cli.main` is the console script.
"""

from sessionlog.cli import main

__all__ = ["main"]
