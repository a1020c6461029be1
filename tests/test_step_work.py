"""The plan's step work (schedule/estimate.split_step_work, runtime_c/tlmrt_plan.h): which calls the C
runtime may split into more tasks than threads, and that a built convolution model carries it."""

from __future__ import annotations

import tarfile
from types import SimpleNamespace

import pytest

from tlmpack.emit.plan_c import render_plan
from tlmpack.schedule.estimate import split_step_work


def _graph(*calls: tuple[str, str]) -> SimpleNamespace:
    names = dict(calls)
    return SimpleNamespace(tasks=[SimpleNamespace(id=t, name=n) for t, n in names.items()],
                           calls=[SimpleNamespace(task=t) for t, _ in calls])


def test_only_convolution_calls_carry_their_work_in_millions_of_operations():
    graph = _graph(("t0", "fused_conv2d_add_relu"), ("t1", "fused_dense_add"), ("t0", "fused_conv2d_add_relu"),
                   ("t2", "softmax"))
    flops = {"t0": 231_211_008, "t1": 604_000_000, "t2": 10_000}
    assert split_step_work(graph, flops) == [231, 0, 231, 0]


def test_a_task_without_an_estimate_is_left_to_the_pool():
    assert split_step_work(_graph(("t0", "fused_conv2d")), {}) == [0]


def test_the_plan_refuses_step_work_that_does_not_match_its_calls():
    graph = SimpleNamespace(tensors=[], calls=[SimpleNamespace(task="t0", args=())], tasks=[], inputs=[], outputs=[],
                            arena_bytes=0, weights=b"")
    with pytest.raises(ValueError, match="step_work has 2 values for 1 calls"):
        render_plan(graph, [], [], "m", "0", step_work=[1, 2])


def test_a_built_convolution_model_tells_the_runtime_its_work(tmp_path):
    torch = pytest.importorskip("torch")
    from click.testing import CliRunner

    from tlmpack.cli import main

    class ConvHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(16, 32, 3, padding=1)
            self.fc = torch.nn.Linear(32, 4)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).mean((2, 3)))

    torch.manual_seed(0)
    onnx_path = tmp_path / "conv.onnx"
    torch.onnx.export(ConvHead().eval(), torch.randn(1, 16, 40, 40), str(onnx_path), input_names=["x"], dynamo=False)
    out = tmp_path / "conv.tar"
    result = CliRunner().invoke(main, ["build", str(onnx_path), "-t", "x86", "-o", str(out), "--scheduler", "heuristic"])
    assert result.exit_code == 0, result.output
    with tarfile.open(out) as tar:
        library = tar.extractfile("x86/model.so").read()
    assert b"tlmrt_plan_v1_step_work" in library  # its dynamic symbol table names it
