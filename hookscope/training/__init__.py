"""Watching a model while it trains. Nothing is imported here, so that
``hookscope.training.watch`` stays the module and ``hookscope.watch`` the function."""
