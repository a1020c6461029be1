"""The synthetic CNN blocks the teacher corpus grows from: seeded, valid ONNX whose onnxruntime
output is real and of the declared shape, holding the tails the held-out tasks have (SiLU,
residual adds, squeeze-excite gates, global pools, classifiers)."""

from collections import Counter

from tests.test_synthetic_convs import assert_runs_in_onnxruntime_with_its_declared_output
from tlmpack.training.synthetic_blocks import make_block_model
from tlmpack.training.synthetic_convs import make_model


def test_same_seed_same_bytes_other_seed_other_model_and_not_the_plain_stacks():
    assert make_block_model(3, 4).SerializeToString() == make_block_model(3, 4).SerializeToString()
    assert make_block_model(3, 4).SerializeToString() != make_block_model(4, 4).SerializeToString()
    assert make_block_model(3).graph.name != make_model(3).graph.name


def test_runs_in_onnxruntime_with_the_declared_output_shape():
    for seed in (0, 4):  # one ends in a classifier, one in a feature map
        assert_runs_in_onnxruntime_with_its_declared_output(make_block_model(seed))


def test_a_few_seeds_hold_every_tail_the_held_out_cnn_tasks_have():
    ops = Counter(n.op_type for seed in range(8) for n in make_block_model(seed).graph.node)
    for op in ("Conv", "Sigmoid", "Mul", "Relu", "Clip", "Add", "GlobalAveragePool", "Gemm"):
        assert ops[op] > 0, op
