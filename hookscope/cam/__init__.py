"""The CAM family: the CAM probe, its methods (one registry), targets, guided backpropagation
and the faithfulness metrics.
"""
