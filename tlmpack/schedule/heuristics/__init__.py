"""Compile-time schedule heuristics: classify a task (classify.py), then derive its design-space
decisions from the hardware description with the first eligible rule (registry.py; one rule per
file: x86_matmul, x86_reduction, x86_pointwise, cuda_gemm, cuda_matmul, cuda_reduction, cuda_pointwise)."""
