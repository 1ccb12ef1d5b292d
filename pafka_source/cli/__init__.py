"""The ``pafka`` command: the tier store's API from a shell.

Every command but ``demo`` and ``create-topic --create-store`` works on an existing store and
never creates one: a mistyped root is an error, not a new empty store. Errors are one line on
stderr with exit status 1; ``-v`` (before or after the command) adds tracebacks.

Modules: :mod:`.main` (the parser and :func:`main`, the console script ``pafka``),
:mod:`.commands` (each subcommand's handler), :mod:`.store_commands`,
:mod:`.group_commands` and :mod:`.topic_commands` (the commands, which return data),
:mod:`.produce`, :mod:`.consume` and :mod:`.perf` (those commands), :mod:`.args`
(argument types shared by the commands), :mod:`.output` (text and JSON),
:mod:`.demo` (``pafka demo``).
"""

from __future__ import annotations

from .main import DESCRIPTION, build_parser, main

__all__ = ["DESCRIPTION", "build_parser", "main"]
