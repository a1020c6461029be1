"""Relax rewrites keep the model's meaning: checked end to end against onnxruntime."""

from __future__ import annotations

import tarfile

import numpy as np
import pytest

from tlmpack.verify import onnxruntime_outputs, rel_err


def test_awkward_matmul_width_is_padded_and_sliced_back(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build
    from tlmpack.lower.x86 import x86_target
    from tlmpack.schedule.hardware import detect_x86

    columns = 8201  # prime: no divisor is a whole vector; 128 x 8201 weights pass the size bar
    weight = np.random.default_rng(0).standard_normal((128, columns)).astype(np.float32) * 0.1
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="head")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 128])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, columns])],
                              initializer=[numpy_helper.from_array(weight, "w")])
    model = tmp_path / "head.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    manifest = build(str(model), tmp_path / "head.tar", BuildOptions())
    assert any("strided_slice" in s["name"] for s in manifest["subgraphs"])
    assert manifest["plan"]["padded_matmuls"] == {"graph": 1}
    # the weight padded at build time to whole pairs of the build host's vectors (8208 columns with
    # AVX2's 8 lanes, 8224 with AVX-512's 16)
    lanes = detect_x86(x86_target().features).lanes(32)
    padded = -(-columns // (2 * lanes)) * 2 * lanes
    assert manifest["memory"]["weights_bytes"] == 128 * padded * 4
    x = np.random.default_rng(1).standard_normal((1, 4, 128)).astype(np.float32)
    (ref,) = onnxruntime_outputs(model, {"x": x})
    (out,) = rt.load(tmp_path / "head.tar").run(None, {"x": x})
    assert out.shape == (1, 4, columns) and rel_err(out, ref) < 1e-4


def _attention_onnx(path, seq: int = 77, heads: int = 4, dim: int = 64, causal: bool = False) -> None:
    """softmax(Q K^T / sqrt(d) [+ causal mask]) V over ``seq`` tokens, Q, K, V inputs: both matmuls
    take activations."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def spec(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    scale = helper.make_tensor("scale", TensorProto.FLOAT, [], [dim ** -0.5])
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["raw"]),
             helper.make_node("Mul", ["raw", "scale"], ["scaled"]),
             helper.make_node("Add" if causal else "Identity", ["scaled", "mask"] if causal else ["scaled"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    shape = [1, heads, seq, dim]
    graph = helper.make_graph(nodes, "attention", [spec("q", shape), spec("k", shape), spec("v", shape)],
                              [spec("y", shape)], initializer=[scale])
    if causal:  # 0 on and below the diagonal, the lowest float above (as transformers' decoders)
        mask = np.triu(np.full((seq, seq), np.finfo(np.float32).min, np.float32), 1)[None, None]
        graph.initializer.append(numpy_helper.from_array(mask, "mask"))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _relax_of(onnx_path):
    from tlmpack.frontend import load_model

    return load_model(str(onnx_path), {}).mod


def test_policy_pads_to_the_first_preferred_multiple_within_the_overhead_bound():
    from tlmpack.graph.relax_rewrites import policy_for

    x86, cuda = policy_for(("x86",), x86_lanes=8), policy_for(("cuda",))
    assert [x86.padded(e) for e in (197, 77, 257, 50257, 1000, 768, 49, 7)] == [208, 80, 272, 50272, 1000, 768, 49, 7]
    # rows: multiples of the AVX2 register tile's 6 rows (2 vectors x 6 rows), friendly 128 included
    assert [x86.padded(e, rows=True) for e in (197, 77, 1000, 49, 128, 96)] == [198, 78, 1002, 54, 132, 96]
    avx512 = policy_for(("x86",), x86_lanes=16, x86_rows=8)
    assert [avx512.padded(e, rows=True) for e in (197, 77, 1000, 49, 128)] == [200, 80, 1000, 49, 128]
    shared = policy_for(("cuda", "x86"))
    assert shared.padded(128, rows=True) == 128  # a graph shared with CUDA keeps its warp-friendly rows
    assert cuda.padded(197) == cuda.padded(197, rows=True) == 208  # 224 would add 13.7 %
    assert cuda.padded(77) == 80 and cuda.padded(1000) == 1024
    assert cuda.padded(50257) == 50304  # whole 128-wide blocks; 50272 = 32 x 1571 has no other width
    assert cuda.padded(197, rows=True) == 208  # rows stay warp multiples


def test_attention_over_an_awkward_sequence_pads_rows_keys_and_the_reduction_exactly(tmp_path):
    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build
    from tlmpack.graph.relax_rewrites import pad_awkward_extents, policy_for

    model = tmp_path / "attention.onnx"
    _attention_onnx(model)
    _, count = pad_awkward_extents(_relax_of(model), policy_for(("x86",)))
    assert count == 2  # Q K^T over 77 x 77 rows/keys, and P V over 77 keys (K, zero-padded on both sides)
    manifest = build(str(model), tmp_path / "attention.tar", BuildOptions(scheduler="heuristic"))
    assert manifest["plan"]["padded_matmuls"] == {"graph": 2}
    rng = np.random.default_rng(3)
    feed = {n: rng.standard_normal((1, 4, 77, 64)).astype(np.float32) for n in "qkv"}
    (ref,) = onnxruntime_outputs(model, feed)
    (out,) = rt.load(tmp_path / "attention.tar").run(None, feed)
    assert np.std(ref) > 0 and rel_err(out, ref) < 1e-4


def test_causal_attention_over_an_awkward_sequence_pads_its_mask_and_stays_exact(tmp_path):
    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build

    model = tmp_path / "causal.onnx"
    _attention_onnx(model, causal=True)
    manifest = build(str(model), tmp_path / "causal.tar", BuildOptions(scheduler="heuristic"))
    assert manifest["plan"]["padded_matmuls"] == {"graph": 2}
    names = [s["name"] for s in manifest["subgraphs"]]
    assert not any("matmul" in n and "pad" in n for n in names), names  # no slice + re-pad of the scores
    rng = np.random.default_rng(5)
    feed = {n: rng.standard_normal((1, 4, 77, 64)).astype(np.float32) for n in "qkv"}
    (ref,) = onnxruntime_outputs(model, feed)
    (out,) = rt.load(tmp_path / "causal.tar").run(None, feed)
    assert np.std(ref) > 0 and rel_err(out, ref) < 1e-4


def test_a_matmul_over_friendly_extents_is_left_untouched(tmp_path):
    from tlmpack.graph.relax_rewrites import pad_awkward_extents, policy_for

    model = tmp_path / "attention.onnx"
    _attention_onnx(model, seq=96)  # rows of 6 (the AVX2 register tile), keys and reductions of 16
    mod = _relax_of(model)
    rewritten, count = pad_awkward_extents(mod, policy_for(("x86",)))
    assert count == 0 and rewritten is mod


def test_switching_padding_off_builds_the_matmul_as_is_and_says_so_in_the_manifest(tmp_path):
    from tlmpack.build import BuildOptions, build

    model = tmp_path / "attention.onnx"
    _attention_onnx(model)
    manifest = build(str(model), tmp_path / "a.tar", BuildOptions(scheduler="heuristic", pad_extents=False))
    assert manifest["build_options"]["pad_extents"] is False
    assert manifest["plan"]["padded_matmuls"] == {"graph": 0}
    assert not any("strided_slice" in s["name"] or "pad" in s["name"] for s in manifest["subgraphs"])


def test_a_padding_rewrite_that_fails_falls_back_to_the_model_as_is(tmp_path, monkeypatch):
    import tlmpack.graph.relax_rewrites
    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build

    def broken(mod, policy):
        raise RuntimeError("InternalError: padding exploded")

    monkeypatch.setattr(tlmpack.graph.relax_rewrites, "pad_awkward_extents", broken)
    model = tmp_path / "attention.onnx"
    _attention_onnx(model)
    manifest = build(str(model), tmp_path / "a.tar", BuildOptions(scheduler="heuristic"))
    assert [(f["transform"], f["scope"]) for f in manifest["fallbacks"]] == [("pad-awkward-extents", "graph")]
    assert "padding exploded" in manifest["fallbacks"][0]["reason"]
    rng = np.random.default_rng(4)
    feed = {n: rng.standard_normal((1, 4, 77, 64)).astype(np.float32) for n in "qkv"}
    (ref,) = onnxruntime_outputs(model, feed)
    (out,) = rt.load(tmp_path / "a.tar").run(None, feed)
    assert rel_err(out, ref) < 1e-4


def test_a_torch_average_pool_covering_its_input_is_a_mean(tmp_path):
    """transformers' EfficientNet pools a 7x7 map with nn.AvgPool2d(1280, ceil_mode=True): taken
    literally, TVM pads each channel to 1286x1286 (8.5 GB). Here 12x12 windows on a 5x5 map."""
    import torch

    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build
    from tlmpack.frontend.torch_rewrites import average_pool_covering_input_to_mean

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.pool = torch.nn.AvgPool2d(12, ceil_mode=True)
            self.small = torch.nn.AvgPool2d(2)  # a real window: left alone

        def forward(self, x):
            y = torch.relu(self.conv(x))
            return self.pool(y).flatten(1) + self.small(y)[:, :, 0, 0]

    torch.manual_seed(0)
    module = Head().eval()
    x = torch.randn(1, 3, 5, 5)
    ep = torch.export.export(module, (x,))
    torch.export.save(ep, tmp_path / "head.pt2")
    rewritten = ep.run_decompositions()
    assert average_pool_covering_input_to_mean(rewritten) == 1
    with torch.no_grad():
        ref = module(x).numpy()
        assert rel_err(rewritten.module()(x).numpy(), ref) < 1e-6
    manifest = build(str(tmp_path / "head.pt2"), tmp_path / "head.tar", BuildOptions())
    # a mean; on x86's channels-last path a matmul by 1/(H*W) (layout_ops.py), the model has no other
    assert any("mean" in s["name"] or s["name"].startswith("matmul") for s in manifest["subgraphs"])
    (out,) = rt.load(tmp_path / "head.tar").run(None, {"x": x.numpy()})
    assert np.abs(ref).max() > 0 and rel_err(out, ref) < 1e-4


@pytest.mark.parametrize("scheduler", ["tlm", "heuristic"])
def test_a_small_encoder_over_77_tokens_is_padded_and_matches_onnxruntime(tmp_path, scheduler):
    import tlmpack.runtime as rt
    from tlmpack import zoo
    from tlmpack.build import BuildOptions, build
    from tlmpack.verify import check_live

    model = tmp_path / "encoder.onnx"
    zoo.export_onnx("encoder-77-tiny", model)
    manifest = build(str(model), tmp_path / "encoder.tar", BuildOptions(scheduler=scheduler))
    assert manifest["plan"]["padded_matmuls"]["graph"] >= 12  # Q, K, V, output, two FFN matmuls a layer
    feed = zoo.random_inputs("encoder-77-tiny")
    (ref,) = onnxruntime_outputs(model, feed)
    check_live("last_hidden_state", ref)
    (out,) = rt.load(tmp_path / "encoder.tar").run(None, feed)
    assert out.shape == (1, 77, 128) and rel_err(out, ref) < 1e-4


def test_padded_attention_builds_for_cuda_with_warp_multiples(tmp_path):
    from tlmpack.build import BuildOptions, build
    from tlmpack.lower.cuda import find_nvcc

    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    model = tmp_path / "attention.onnx"
    _attention_onnx(model, seq=197)
    manifest = build(str(model), tmp_path / "attention.tar", BuildOptions(targets=("cuda",), scheduler="heuristic"))
    assert manifest["plan"]["padded_matmuls"] == {"graph": 2}
    # 197 keys: 224 (a warp multiple) would add 13.7 %, so 208; the scores kernel reads a 208-wide K^T
    assert any("matmul" in s["name"] for s in manifest["subgraphs"])
    with tarfile.open(tmp_path / "attention.tar") as tar:
        source = "".join(tar.extractfile(m).read().decode(errors="replace") for m in tar.getmembers()
                         if m.name.endswith(".cu"))
    assert "208" in source


def _reshaped_gemm_onnx(path, first: str, shape: list[int], perm: list[int] | None = None) -> tuple[int, int]:
    """``first`` (Tanh, Transpose, LayerNormalization) over an input of ``shape``, a Reshape to
    [rows, columns], then a Gemm with bias: GPT-2's Conv1D reads its [1, T, C] input so, and attention
    merges its heads so."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    after = [shape[i] for i in perm] if perm else shape
    rows, columns = after[1], int(np.prod(after[2:]))
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((columns, 256)) / np.sqrt(columns)).astype(np.float32)
    b = (0.1 * rng.standard_normal(256)).astype(np.float32)
    norm = first == "LayerNormalization"
    nodes = [helper.make_node(first, ["x", "s", "bb"] if norm else ["x"], ["a"], **({"perm": perm} if perm else {})),
             helper.make_node("Reshape", ["a", "shape"], ["r"]),
             helper.make_node("Gemm", ["r", "w", "b"], ["y"])]
    graph = helper.make_graph(nodes, "reshaped_gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 256])],
                              [numpy_helper.from_array(np.array([rows, columns], np.int64), "shape"),
                               numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    if norm:
        graph.initializer.extend([numpy_helper.from_array(np.full(shape[-1], 1.5, np.float32), "s"),
                                  numpy_helper.from_array(np.full(shape[-1], 0.25, np.float32), "bb")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return rows, columns


@pytest.mark.parametrize("first, shape, perm, pad_fused", [
    ("Tanh", [1, 77, 256], None, True),  # rows padded 77 -> 78 before the reshape: the pad joins the tanh
    ("Transpose", [1, 4, 77, 64], [0, 2, 1, 3], True),  # heads merged: the pad joins the transpose
    ("Tanh", [1, 77, 3, 67], None, False),  # 201 columns padded too: they cannot be spread over 3 x 67
    ("LayerNormalization", [1, 77, 256], None, False),  # inside a reduction's kernel the pad ran 3.8x slower
])
def test_a_pad_before_a_reshape_joins_the_kernel_that_produces_it(tmp_path, first, shape, perm, pad_fused):
    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build

    model = tmp_path / "m.onnx"
    rows, _ = _reshaped_gemm_onnx(model, first, shape, perm)
    manifest = build(str(model), tmp_path / "m.tar", BuildOptions(scheduler="heuristic", cpu="haswell", cores=2))
    assert manifest["plan"]["padded_matmuls"] == {"graph": 1}
    names = [s["name"] for s in manifest["subgraphs"]]
    producer = {"Tanh": "tanh", "Transpose": "transpose", "LayerNormalization": "layer_norm"}[first]
    assert any(producer in n and "pad" in n for n in names) == pad_fused, names
    assert any(n.startswith("pad") for n in names) != pad_fused, names
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    (ref,) = onnxruntime_outputs(model, {"x": x})
    assert np.abs(ref).max() > 0 and np.isfinite(ref).all()
    (out,) = rt.load(tmp_path / "m.tar").run(None, {"x": x})
    assert out.shape == (rows, 256) and rel_err(out, ref) < 1e-4
