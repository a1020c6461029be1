"""Acceptance on the whole seed models (slow: minutes each). Run with ``pytest -m slow``."""

from __future__ import annotations

import pytest

from tlmpack.verify import check_input_sensitive, check_live, onnxruntime_outputs, rel_err

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", ["resnet50", "mobilenetv2", "bert-base", "gpt2"])
def test_seed_model_matches_onnxruntime(build_zoo_model, name):
    import tlmpack.runtime as rt
    from tlmpack import zoo

    onnx_path, tar = build_zoo_model(name)
    model = rt.load(tar)
    previous = None
    for seed in (21, 22):
        feed = zoo.random_inputs(name, seed)
        refs = onnxruntime_outputs(onnx_path, feed)
        for i, (spec, out, ref) in enumerate(zip(model.outputs, model.run(None, feed), refs, strict=True)):
            check_live(spec.name, ref)
            if previous is not None:
                check_input_sensitive(spec.name, previous[i], ref)
            assert rel_err(out, ref) < 1e-4, (name, spec.name)
        previous = refs


def test_seed_model_through_torch_export_matches_torch(tmp_path):
    import torch

    import tlmpack.runtime as rt
    from tlmpack import zoo
    from tlmpack.build import BuildOptions, build

    tar = tmp_path / "bert_tiny_torch.tar"
    build("tlmpack.zoo:bert_tiny_factory", tar, BuildOptions())
    module, _, input_names, _ = zoo.get_model("bert-tiny")
    model = rt.load(tar)
    feed = zoo.random_inputs("bert-tiny", 9)
    with torch.no_grad():
        ref = module(*(torch.from_numpy(feed[n]) for n in input_names)).numpy()
    check_live("out", ref)
    (out,) = model.run(None, {s.name: feed[n] for s, n in zip(model.inputs, input_names, strict=True)})
    assert rel_err(out, ref) < 1e-4
