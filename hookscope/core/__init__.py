"""The core: the one driver (run), the hook engine (hooks), errors, the output contract (output),
torchrun, and the small vocabulary every layer shares.
"""
