"""matmul_views.py: attention's head transposes folded into the batch matmuls around them, the
model's meaning kept (checked against onnxruntime on the x86 build of the same graph rewrite)."""

from __future__ import annotations

import numpy as np
import pytest

B, S, H, D = 2, 16, 4, 8  # batch, sequence, heads, head width
HIDDEN = H * D


def attention_onnx(path) -> None:
    """One self-attention block as exporters write it: Q/K/V projections, reshape to heads,
    transposes (K's to [b, h, d, s]), scaled Q K^T, softmax, P V, the inverse transpose and the
    output projection."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32) * 0.2, f"W{n}")
             for n in "qkvo"]
    inits += [numpy_helper.from_array(np.array([B, S, H, D], np.int64), "heads"),
              numpy_helper.from_array(np.array([B, S, HIDDEN], np.int64), "merged"),
              numpy_helper.from_array(np.array(1 / np.sqrt(D), np.float32), "scale")]
    nodes = []
    for n, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("MatMul", ["x", f"W{n}"], [f"{n}p"]),
                  helper.make_node("Reshape", [f"{n}p", "heads"], [f"{n}h"]),
                  helper.make_node("Transpose", [f"{n}h"], [f"{n}t"], perm=perm)]
    nodes += [helper.make_node("MatMul", ["qt", "kt"], ["s"]),
              helper.make_node("Mul", ["s", "scale"], ["ss"]),
              helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vt"], ["c"]),
              helper.make_node("Transpose", ["c"], ["ct"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ct", "merged"], ["cm"]),
              helper.make_node("MatMul", ["cm", "Wo"], ["y"])]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, HIDDEN])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, S, HIDDEN])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def conv1d_gelu_onnx(path, rows: int = 16, k: int = 32, n: int = 96) -> None:
    """GPT-2's Conv1D as exported: Reshape to rows, Gemm with a bias, Reshape back, then a tanh-GELU
    and a residual-like add of the output to itself."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32) * 0.2, "W"),
             numpy_helper.from_array(rng.standard_normal((n,)).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([-1, k], np.int64), "flat"),
             numpy_helper.from_array(np.array([1, rows, n], np.int64), "back"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["x2"]), helper.make_node("Gemm", ["x2", "W", "b"], ["g"]),
             helper.make_node("Reshape", ["g", "back"], ["g3"]), helper.make_node("Tanh", ["g3"], ["t"]),
             helper.make_node("Mul", ["g3", "t"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y0"]),
             helper.make_node("Add", ["y0", "g3"], ["y"])]
    graph = helper.make_graph(nodes, "conv1d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, rows, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def _imported(tmp_path):
    from tlmpack.frontend import load_model

    path = tmp_path / "attention.onnx"
    attention_onnx(path)
    return load_model(str(path)).mod


def _ops(mod) -> list[str]:
    from tvm import relax

    names = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call):
                names.append(getattr(value.op, "name", None) or str(value.args[0].name_hint
                                                                     if hasattr(value.args[0], "name_hint") else ""))
    return names


def test_head_transposes_of_q_v_and_the_output_fold_and_ks_stays(tmp_path):
    from tlmpack.graph.matmul_views import fold_transposes_into_matmuls

    mod = _imported(tmp_path)
    before = _ops(mod).count("relax.permute_dims")
    folded, count = fold_transposes_into_matmuls(mod)
    assert before == 4 and count == 3  # Q's, V's and the output's; K's makes d the contiguous axis
    assert _ops(folded).count("relax.permute_dims") == 1


def test_the_scale_after_q_k_still_fuses_into_its_matmul(tmp_path):
    from tlmpack.graph import fuse_to_tir
    from tlmpack.graph.matmul_views import fold_transposes_into_matmuls

    fused = fuse_to_tir(fold_transposes_into_matmuls(_imported(tmp_path))[0], pad_policy=None)
    names = sorted(gv.name_hint for gv in fused.functions.keys())
    assert "fused_matmul_multiply" in names  # an alias binding in between would have split them
    assert sum(n.startswith("transpose") for n in names) == 1


def _run_on_cpu(mod, x: np.ndarray) -> np.ndarray:
    import tvm
    from tvm import relax

    mod = relax.transform.LegalizeOps()(mod)
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_the_folded_graph_computes_what_onnxruntime_does(tmp_path):
    import onnxruntime as ort

    from tlmpack.graph.matmul_views import fold_transposes_into_matmuls

    mod = _imported(tmp_path)
    x = np.random.default_rng(1).standard_normal((B, S, HIDDEN)).astype(np.float32)
    (ref,) = ort.InferenceSession(str(tmp_path / "attention.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.abs(ref).max() > 0.1 and np.isfinite(ref).all()
    out = _run_on_cpu(fold_transposes_into_matmuls(mod)[0], x)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5


def test_a_transpose_with_a_second_user_stays(tmp_path):
    from tvm import relax

    from tlmpack.graph.matmul_views import fold_transposes_into_matmuls

    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((1, 16, 4, 8), "float32"))
    v = relax.Var("v", relax.TensorType((1, 4, 8, 16), "float32"))
    with bb.function("main", [q, v]):
        with bb.dataflow():
            qt = bb.emit(relax.op.permute_dims(q, [0, 2, 1, 3]))
            p = bb.emit(relax.op.matmul(qt, v))
            out = bb.emit_output(relax.op.add(relax.op.sum(p), relax.op.sum(qt)))
        bb.emit_func_output(out)
    folded, count = fold_transposes_into_matmuls(bb.get())
    assert count == 0 and _ops(folded).count("relax.permute_dims") == 1


def _transpose_tasks(artifact) -> int:
    import json
    import tarfile

    with tarfile.open(artifact) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
    return sum("transpose" in s["id"] for s in manifest["subgraphs"])


@pytest.mark.parametrize("targets,transposes,knob", [("cuda", 1, ""), ("x86", 3, ""), ("x86", 1, "all")])
def test_a_cuda_graph_folds_the_head_transposes_and_an_x86_one_keeps_them(targets, transposes, knob, tmp_path):
    import os
    import subprocess
    import sys

    from tlmpack.lower.cuda import find_nvcc

    if targets == "cuda" and find_nvcc() is None:
        pytest.skip("nvcc not found: the cuda target cannot be built here")
    attention_onnx(tmp_path / "attention.onnx")
    out = tmp_path / f"{targets}.tar"
    done = subprocess.run([sys.executable, "-m", "tlmpack.cli", "build", str(tmp_path / "attention.onnx"), "-t", targets,
                           "--scheduler", "heuristic", "-o", str(out)], capture_output=True, text=True,
                          env={**os.environ, "TLMPACK_MATMUL_VIEWS": knob})  # "all": the x86 A/B knob
    assert done.returncode == 0, done.stderr[-2000:]
    assert ("head transposes folded" in done.stderr + done.stdout) == (transposes == 1)
    assert _transpose_tasks(out) == transposes


def test_a_reshape_after_a_2d_product_is_lifted_so_the_gelu_fuses_into_the_gemm(tmp_path):
    import onnxruntime as ort

    from tlmpack.frontend import load_model
    from tlmpack.graph import fuse_to_tir
    from tlmpack.graph.matmul_views import rewrite_matmul_views

    conv1d_gelu_onnx(tmp_path / "conv1d.onnx")
    mod = load_model(str(tmp_path / "conv1d.onnx")).mod
    before = [gv.name_hint for gv in fuse_to_tir(mod, pad_policy=None).functions.keys() if gv.name_hint != "main"]
    rewritten, lifted, folded = rewrite_matmul_views(mod)
    after = [gv.name_hint for gv in fuse_to_tir(rewritten, pad_policy=None).functions.keys() if gv.name_hint != "main"]
    assert (lifted, folded) == (1, 0)
    assert len(before) == 2 and len(after) == 1 and after[0].startswith("fused_matmul_add")
    x = np.random.default_rng(2).standard_normal((1, 16, 32)).astype(np.float32)
    (ref,) = ort.InferenceSession(str(tmp_path / "conv1d.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.abs(ref).max() > 0.1 and np.isfinite(ref).all()
    out = _run_on_cpu(rewritten, x)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5


def test_a_product_with_another_user_keeps_its_reshape(tmp_path):
    from tvm import relax

    from tlmpack.graph.matmul_views import lift_matmul_reshapes

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 32), "float32"))
    w = relax.Var("w", relax.TensorType((32, 8), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            p = bb.emit(relax.op.matmul(x, w))
            r = bb.emit(relax.op.reshape(p, [1, 16, 8]))
            out = bb.emit_output(relax.op.add(relax.op.sum(r), relax.op.sum(p)))
        bb.emit_func_output(out)
    assert lift_matmul_reshapes(bb.get())[1] == 0
