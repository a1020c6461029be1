"""tlmpack.zoo: tiny seed models export to ONNX, run in onnxruntime, match torch and are live."""

from __future__ import annotations

import hashlib
import importlib
import subprocess
import sys

import numpy as np
import pytest

from tlmpack import zoo

TINY = zoo.names(tiny=True)


def test_tiny_list():
    assert set(TINY) == {"resnet-tiny", "bert-tiny", "gpt2-tiny", "mlp", "encoder-77-tiny"}
    assert set(zoo.BENCH_DEFAULT) <= set(zoo.names(tiny=False))


def test_import_is_cheap():
    code = "import sys, tlmpack.zoo; print(any(m in sys.modules for m in ('torch', 'transformers', 'onnx')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", TINY)
def test_tiny_export_matches_torch(name, tmp_path):
    import onnx

    path = tmp_path / f"{name}.onnx"
    info = zoo.export_onnx(name, path)
    assert path.exists() and info["size_bytes"] > 0 and info["data_bytes"] == 0
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    spec = zoo.spec(name)
    assert [i.name for i in model.graph.input] == [i.name for i in spec.inputs]
    assert [o.name for o in model.graph.output] == list(spec.outputs)
    for gi, si in zip(model.graph.input, spec.inputs, strict=True):  # fixed shapes, no dynamic axes
        assert [d.dim_value for d in gi.type.tensor_type.shape.dim] == list(si.shape)
    assert {n.op_type for n in model.graph.node}.isdisjoint({"Identity", "Shape", "ConstantOfShape"})

    res = zoo.check_onnx(name, path)
    assert res["finite"] and res["live"], res
    assert res["rel_err"] < 1e-4, res
    assert res["ok"], res


def test_export_is_deterministic(tmp_path):
    digests = []
    for i in range(2):
        p = tmp_path / f"gpt2-tiny.{i}.onnx"
        zoo.export_onnx("gpt2-tiny", p)
        digests.append(hashlib.sha256(p.read_bytes()).hexdigest())
    assert digests[0] == digests[1]


def test_seed_changes_weights_not_shapes():
    import torch

    a, xa, _, _ = zoo.get_model("mlp", seed=0)
    b, xb, _, _ = zoo.get_model("mlp", seed=1)
    c, _, _, _ = zoo.get_model("mlp", seed=0)
    assert xa[0].shape == xb[0].shape
    with torch.no_grad():
        assert not torch.equal(a(*xa), b(*xa))
        assert torch.equal(a(*xa), c(*xa))


@pytest.mark.parametrize("name", TINY)
def test_random_inputs(name):
    feed = zoo.random_inputs(name, seed=3)
    again = zoo.random_inputs(name, seed=3)
    for inp in zoo.spec(name).inputs:
        x = feed[inp.name]
        assert x.shape == inp.shape and x.dtype == np.dtype(inp.dtype)
        np.testing.assert_array_equal(x, again[inp.name])
        if inp.dtype == "int64":
            assert x.min() >= 0 and x.max() < inp.high
        else:
            assert 0.5 < x.std() < 1.5


@pytest.mark.parametrize("name", TINY)
def test_factory_string(name):
    """``tlmpack.zoo:<name>_factory`` works with torch.export, with the same input names as the ONNX."""
    import torch

    module_name, _, attr = f"tlmpack.zoo:{name.replace('-', '_')}_factory".partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    module, example = factory()
    assert isinstance(example, tuple)
    ep = torch.export.export(module, example)
    user_inputs = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    assert user_inputs == [i.name for i in zoo.spec(name).inputs]
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(*example), module(*example), rtol=0, atol=0)
