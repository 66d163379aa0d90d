"""Watching a model while it trains: ``hookscope.watch`` (:mod:`hookscope.training.watch`).

Nothing is imported here, so that ``hookscope.training.watch`` stays the module and
``hookscope.watch`` (resolved lazily by the package root) the function.
"""
