"""The probes: one analysis each (stats, debug, structure, grads, features, ablate, diff),
and the offline comparison of saved ``stats`` documents (statsdiff).
"""
