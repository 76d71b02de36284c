"""Helpers every other package may use.

:mod:`~meshops.utils.atomic` (files written completely or not at all),
:mod:`~meshops.utils.checkpoint` (checkpoint files read with their checks),
:mod:`~meshops.utils.checks` (argument checks of the layers),
:mod:`~meshops.utils.memory` (free memory, bounded reads),
:mod:`~meshops.utils.progress` (progress bars) and
:mod:`~meshops.utils.allocator` (:func:`keep_freed_memory`, the one public name here:
the rest is internal and free to change).

Imports nothing of meshops but :mod:`meshops.errors`.
"""
