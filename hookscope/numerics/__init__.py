"""hookscope's numerics, each in one place: moments and their exact merge, the deferred
device-read table, the comparison sums of ``diff``, the percentile sketch, drift, the
layer-health thresholds, and the rule that says which dimension holds the channels."""
