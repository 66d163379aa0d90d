"""The probes: one analysis each (stats, debug, structure, grads, features, ablate, diff,
check, report), with the numerics they share.
"""
