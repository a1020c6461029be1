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
    from tlmpack.matmul_views import fold_transposes_into_matmuls

    mod = _imported(tmp_path)
    before = _ops(mod).count("relax.permute_dims")
    folded, count = fold_transposes_into_matmuls(mod)
    assert before == 4 and count == 3  # Q's, V's and the output's; K's makes d the contiguous axis
    assert _ops(folded).count("relax.permute_dims") == 1


def test_the_scale_after_q_k_still_fuses_into_its_matmul(tmp_path):
    from tlmpack.graph import fuse_to_tir
    from tlmpack.matmul_views import fold_transposes_into_matmuls

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

    from tlmpack.matmul_views import fold_transposes_into_matmuls

    mod = _imported(tmp_path)
    x = np.random.default_rng(1).standard_normal((B, S, HIDDEN)).astype(np.float32)
    (ref,) = ort.InferenceSession(str(tmp_path / "attention.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.abs(ref).max() > 0.1 and np.isfinite(ref).all()
    out = _run_on_cpu(fold_transposes_into_matmuls(mod)[0], x)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5


def test_a_transpose_with_a_second_user_stays(tmp_path):
    from tvm import relax

    from tlmpack.matmul_views import fold_transposes_into_matmuls

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


@pytest.mark.parametrize("targets,transposes", [("cuda", 1), ("x86", 3)])
def test_a_cuda_graph_folds_the_head_transposes_and_an_x86_one_keeps_them(targets, transposes, tmp_path):
    import subprocess
    import sys

    from tlmpack.lower.cuda import find_nvcc

    if targets == "cuda" and find_nvcc() is None:
        pytest.skip("nvcc not found: the cuda target cannot be built here")
    attention_onnx(tmp_path / "attention.onnx")
    out = tmp_path / f"{targets}.tar"
    done = subprocess.run([sys.executable, "-m", "tlmpack.cli", "build", str(tmp_path / "attention.onnx"), "-t", targets,
                           "--scheduler", "heuristic", "-o", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert ("head transposes folded" in done.stderr + done.stdout) == (targets == "cuda")
    assert _transpose_tasks(out) == transposes
