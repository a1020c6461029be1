"""small_powers.py: x ** 2, 3, 4 become products (no scalar powf per element); other exponents stay
powers; the compiled model still matches onnxruntime."""

from __future__ import annotations

import numpy as np

from tlmpack.verify import onnxruntime_outputs, rel_err


def _pow_model(path, exponents: list[float | None]) -> None:
    """y_i = x ** e_i for each exponent (None: the exponent is the input e, elementwise)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, outputs, inits = [], [], []
    for i, e in enumerate(exponents):
        if e is not None:
            inits.append(numpy_helper.from_array(np.array(e, np.float32), f"e{i}"))
        nodes.append(helper.make_node("Pow", ["x", f"e{i}" if e is not None else "e"], [f"y{i}"]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [4, 64]))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64]),
              helper.make_tensor_value_info("e", TensorProto.FLOAT, [4, 64])]
    graph = helper.make_graph(nodes, "pow", inputs, outputs, initializer=inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_whole_small_exponents_become_products_and_the_others_stay(tmp_path):
    from tlmpack.frontend import load_model
    from tlmpack.graph.small_powers import small_powers_as_products

    _pow_model(tmp_path / "pow.onnx", [2.0, 3.0, 4.0, 0.5, 5.0, None])
    mod = load_model(str(tmp_path / "pow.onnx")).mod
    assert mod["main"].script().count("R.power(") == 6
    script = small_powers_as_products(mod)["main"].script()
    assert script.count("R.power(") == 3  # 0.5, 5 and the per-element exponent
    assert script.count("R.multiply(") == 1 + 2 + 2  # x*x; (x*x)*x; (x*x)*(x*x) with its square


def test_a_model_with_small_powers_matches_onnxruntime(tmp_path):
    import tlmpack.runtime as rt
    from tlmpack.build import BuildOptions, build

    model = tmp_path / "pow.onnx"
    _pow_model(model, [2.0, 3.0, 4.0, 0.5, None])
    build(str(model), tmp_path / "pow.tar", BuildOptions(scheduler="heuristic"))
    rng = np.random.default_rng(0)
    feed = {"x": rng.uniform(0.1, 2.0, (4, 64)).astype(np.float32) * rng.choice([-1, 1], (4, 64)).astype(np.float32),
            "e": rng.integers(1, 4, (4, 64)).astype(np.float32)}
    feed["x"][0, :4] = [0.0, -0.0, np.inf, -np.inf]
    refs = onnxruntime_outputs(model, feed)
    outs = rt.load(tmp_path / "pow.tar").run(None, feed)
    for i, (out, ref) in enumerate(zip(outs, refs, strict=True)):
        finite = np.isfinite(ref)
        assert np.array_equal(np.isnan(out), np.isnan(ref)), f"output {i}: NaN where onnxruntime has none"
        assert np.array_equal(out[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)]), f"output {i}: infinities"
        assert rel_err(out[finite], ref[finite]) < 1e-6, f"output {i}"
