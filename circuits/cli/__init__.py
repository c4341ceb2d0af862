"""The interfaces layer: the ``circuits`` command (``main``) and what only it runs.

``commands`` (``main``, the parser and the commands: ``circuits print``, ``cost``,
``profile``, ``demo``, ``parity``), ``demo`` (the shipped induction model,
masked, split and ablated: ``circuits demo``) and ``parity`` (the gradient
parity report against Hugging Face's backward: ``circuits parity``).
``python -m circuits`` runs ``main``.
"""

from circuits.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
