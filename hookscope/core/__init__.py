"""The core: the one driver (run), the hook engine (hooks) and the modules it hooks (select),
errors, the output contract (output), the model's load options, torchrun, and the small
vocabulary every layer shares.
"""
