"""The core: the one driver (run), the hook engine (hooks), one invocation (session), errors,
torchrun, and the small vocabulary every layer shares.
"""
