"""Compile-time schedule heuristics (issue 4, in progress): classify a task, then derive its
design-space decisions from the hardware description. Today: the classifier."""
