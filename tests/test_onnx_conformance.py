"""A fixed, fast subset of ONNX's own conformance cases (the full table: bench/onnx_conformance.py,
docs/onnx-conformance.md). Run in this process: the child-process isolation is the full run's job."""

from __future__ import annotations

import pytest

from tlmpack.testing import conformance

PASSING = [
    "simple/test_single_relu_model",
    "simple/test_sequence_model3",  # a negative SequenceInsert position: TVM 0.27 counts it off by one
    "pytorch-operator/test_operator_index",  # Slice-1 (attributes): converted to opset 13 first
    "pytorch-converted/test_Conv2d_groups",
    "pytorch-converted/test_PReLU_2d_multiparam",  # opset 6: a per-channel slope TVM's PRelu asserts on
]
REFUSED = {
    "simple/test_expand_shape_model1": "'Expand'",  # the shape is a model input: not static
}


@pytest.mark.parametrize("case", PASSING)
def test_conformance_case_matches_the_stored_outputs(case, tmp_path):
    result = conformance.run_case(conformance.data_root() / case, tmp_path)
    assert result.status == "pass", result.message


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_conformance_case_is_refused_in_one_line_naming_the_operator(case, tmp_path):
    result = conformance.run_case(conformance.data_root() / case, tmp_path)
    assert result.status == "refused", result.message
    assert result.names_op and REFUSED[case] in result.message
