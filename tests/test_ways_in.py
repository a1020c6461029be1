"""More ways in: external-data ONNX, bool and float16 inputs, several int64 inputs and several
outputs (a tiny transformers BERT) from the TorchScript and the dynamo exporters, end to end
against onnxruntime."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tlmpack.testing import onnx_cases
from tlmpack.verify import check_input_sensitive, check_live, compare, onnxruntime_outputs, rel_err

CLI = [sys.executable, "-m", "tlmpack.cli"]


def _build(model, tar) -> None:
    result = subprocess.run([*CLI, "build", str(model), "-t", "x86", "-o", str(tar)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_external_data_model_builds_and_matches_onnxruntime(tmp_path):
    model = onnx_cases.external_data_mlp(tmp_path / "ext.onnx")
    assert (tmp_path / "ext.weights").stat().st_size > 40_000  # the weights are not in the .onnx
    _build(model, tmp_path / "ext.tar")
    assert max(compare(tmp_path / "ext.tar", model)) < 1e-4


def test_external_data_is_read_once_into_tvm_not_the_protobuf_and_hashed_into_the_source(tmp_path, monkeypatch):
    import onnx.external_data_helper as helper

    from tlmpack.frontend import load_model, onnx_external

    model = onnx_cases.external_data_mlp(tmp_path / "ext.onnx")
    reads = []
    real = onnx_external.read_external
    monkeypatch.setattr(onnx_external, "read_external", lambda t, base: reads.append(t.name) or real(t, base))
    monkeypatch.setattr(helper, "load_external_data_for_model", lambda *a, **k: pytest.fail("loaded into the protobuf"))
    first = load_model(str(model)).source.sha256
    assert sorted(reads) == ["b1", "w1", "w2"]
    weights = bytearray((tmp_path / "ext.weights").read_bytes())
    weights[100] ^= 1
    (tmp_path / "ext.weights").write_bytes(bytes(weights))
    assert load_model(str(model)).source.sha256 != first


def test_truncated_external_data_is_refused_naming_the_initializer(tmp_path):
    from tlmpack.errors import ModelLoadError
    from tlmpack.frontend import load_model

    model = onnx_cases.external_data_mlp(tmp_path / "ext.onnx")
    weights = tmp_path / "ext.weights"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ModelLoadError, match="could not read its external data.*initializer 'b1'.*ends at byte"):
        load_model(str(model))


def test_external_constant_node_and_float16_initializer_match_onnxruntime(tmp_path):
    """Tensors that are not float32 initializers: a Constant node's value saved as external data
    (onnx loads it into the protobuf) and a float16 weight (read straight into TVM)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    w = numpy_helper.from_array((rng.standard_normal((16, 8)) / 4).astype(np.float16), "w")
    c = numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "c_value")
    nodes = [helper.make_node("Constant", [], ["c"], value=c), helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Cast", ["h"], ["h32"], to=TensorProto.FLOAT), helper.make_node("Add", ["h32", "c"], ["y"])]
    graph = helper.make_graph(nodes, "ext16", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], initializer=[w])
    path = tmp_path / "ext16.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path),
                    save_as_external_data=True, location="ext16.weights", size_threshold=0, convert_attribute=True)
    assert (tmp_path / "ext16.weights").stat().st_size == 16 * 8 * 2 + 4 * 8 * 4
    _build(path, tmp_path / "ext16.tar")
    assert max(compare(tmp_path / "ext16.tar", path)) < 1e-3


def test_external_data_outside_the_model_folder_is_refused(tmp_path):
    import onnx

    from tlmpack.errors import ModelLoadError
    from tlmpack.frontend import load_model

    model_path = onnx_cases.external_data_mlp(tmp_path / "ext.onnx")
    model = onnx.load(str(model_path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../../etc/passwd"
    onnx.save(model, str(model_path))
    with pytest.raises(ModelLoadError, match="not a file next to the model"):
        load_model(str(model_path))


def test_bool_and_float16_inputs_match_onnxruntime(tmp_path):
    import tlmpack.runtime as rt

    model = onnx_cases.bool_and_float16_inputs(tmp_path / "dtypes.onnx")
    _build(model, tmp_path / "dtypes.tar")
    m = rt.load(tmp_path / "dtypes.tar", device="cpu")
    assert [(s.name, s.dtype) for s in m.inputs] == [("x16", "float16"), ("keep", "bool")]
    rng = np.random.default_rng(5)
    feed = {"x16": rng.standard_normal((3, 8)).astype(np.float16), "keep": rng.random((3, 8)) < 0.5}
    (ref,) = onnxruntime_outputs(model, feed)
    check_live("y", ref)
    assert rel_err(m.run(None, feed)[0], ref) < 1e-6


def _check_bert(tmp_path, model) -> None:
    import tlmpack.runtime as rt

    _build(model, tmp_path / "bert.tar")
    m = rt.load(tmp_path / "bert.tar", device="cpu")
    assert [s.name for s in m.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [s.dtype for s in m.inputs] == ["int64"] * 3
    assert [s.name for s in m.outputs] == ["last_hidden_state", "pooler_output"]
    feed, other = onnx_cases.bert_feed(1), onnx_cases.bert_feed(2)
    refs, other_refs = onnxruntime_outputs(model, feed), onnxruntime_outputs(model, other)
    outs = m.run(None, feed)
    for spec, out, ref, ref_b in zip(m.outputs, outs, refs, other_refs, strict=True):
        check_live(spec.name, ref)
        check_input_sensitive(spec.name, ref, ref_b)
        assert rel_err(out, ref) < 1e-4, spec.name


@pytest.mark.slow
def test_bert_torchscript_export_three_inputs_two_outputs_matches_onnxruntime(tmp_path):
    _check_bert(tmp_path, onnx_cases.export_tiny_bert(tmp_path / "bert.onnx", dynamo=False, opset=14))


@pytest.mark.slow
def test_bert_dynamo_export_opset18_matches_onnxruntime(tmp_path):
    _check_bert(tmp_path, onnx_cases.export_tiny_bert(tmp_path / "bert.onnx", dynamo=True, opset=18))


@pytest.mark.slow
@pytest.mark.parametrize(("dynamo", "opset"), [(False, 7), (False, 9), (False, 11), (False, 13), (False, 17),
                                               (True, 18)])
def test_torch_exporters_from_opset_7_up_match_onnxruntime(tmp_path, dynamo, opset):
    model = onnx_cases.export_small_torch_cnn(tmp_path / "cnn.onnx", dynamo=dynamo, opset=opset)
    _build(model, tmp_path / "cnn.tar")
    assert max(compare(tmp_path / "cnn.tar", model)) < 1e-4
