"""The task corpus: which models' subgraphs the dataset covers, and how their tasks are extracted
(torch module with seeded random weights → torch.export → Relax → fused TIR → partition).

Held-out models (HELD_OUT) are collected like the others but no training may read their records:
they are for evaluation only. A task that also occurs in a training model is not held out.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CorpusModel:
    """One corpus model: a zoo builder and its config, at one input shape."""

    name: str
    builder: str  # a _build_* function of tlmpack.zoo
    kwargs: dict[str, Any] = field(default_factory=dict)
    input_name: str = "input_ids"
    input_shape: tuple[int, ...] = ()
    input_dtype: str = "int64"


def _vision(name: str, builder: str, batch: int, **kw) -> CorpusModel:
    return CorpusModel(f"{name}@b{batch}" if batch > 1 else name, builder, kw, "pixel_values",
                       (batch, 3, 224, 224), "float32")


def _text(name: str, builder: str, seq: int, batch: int, **kw) -> CorpusModel:
    return CorpusModel(f"{name}@b{batch}" if batch > 1 else name, builder, {"seq": seq, **kw}, "input_ids",
                       (batch, seq), "int64")


_RESNET18 = dict(embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic",
                 num_labels=1000)
_RESNET50 = dict(embedding_size=64, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3],
                 layer_type="bottleneck", num_labels=1000)
_MOBILENET = dict(depth_multiplier=1.0, image_size=224, num_labels=1000)
_EFFICIENTNET = dict(width_coefficient=1.0, depth_coefficient=1.0, image_size=224, hidden_dim=1280,
                     dropout_rate=0.2, num_labels=1000)
_BERT_TINY = dict(vocab_size=30522, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=512)
_BERT_BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=1, num_attention_heads=12,
                  intermediate_size=3072)  # one layer: every layer has the same tasks
_GPT2 = dict(vocab_size=50257, n_layer=1, n_embd=768, n_head=12)
_LLAMA = dict(vocab_size=32000, num_hidden_layers=1, max_position_embeddings=2048)


def _models() -> list[CorpusModel]:
    out = []
    for batch in (1, 8):
        out += [_vision("resnet18", "_build_resnet", batch, **_RESNET18),
                _vision("resnet50", "_build_resnet", batch, **_RESNET50),
                _vision("mobilenetv2", "_build_mobilenetv2", batch, **_MOBILENET),
                _vision("efficientnet-b0", "_build_efficientnet", batch, **_EFFICIENTNET)]
    for batch in (1, 4):
        for seq in (64, 128, 256):
            out += [_text(f"bert-tiny-s{seq}", "_build_bert", seq, batch, **_BERT_TINY),
                    _text(f"bert-base-s{seq}", "_build_bert", seq, batch, **_BERT_BASE)]
        out += [_text("gpt2-s128", "_build_gpt2", 128, batch, **_GPT2),
                _text("llama-h2048-s128", "_build_llama", 128, batch, hidden_size=2048, intermediate_size=5504,
                      num_attention_heads=16, num_key_value_heads=16, **_LLAMA),
                _text("llama-h4096-s128", "_build_llama", 128, batch, hidden_size=4096, intermediate_size=11008,
                      num_attention_heads=32, num_key_value_heads=32, **_LLAMA)]
    return out


MODELS: dict[str, CorpusModel] = {m.name: m for m in _models()}
HELD_OUT = ("resnet18", "resnet18@b8", "bert-base-s256", "bert-base-s256@b4")
# A quick first collection: small and mid models first, the big decoders last.
DEFAULT_ORDER = ("bert-tiny-s64", "bert-tiny-s128", "mobilenetv2", "resnet50", "bert-base-s128", "gpt2-s128",
                 "efficientnet-b0", "bert-tiny-s256", "bert-base-s64", "llama-h2048-s128")


def task_key(func) -> str:
    """A task's identity across models: the structural hash of its PrimFunc without its name."""
    import tvm_ffi

    if func.attrs is not None and "global_symbol" in func.attrs:
        func = func.without_attr("global_symbol")
    return f"{tvm_ffi.structural_hash(func) & 0xFFFFFFFFFFFFFFFF:016x}"


def build_module(model: CorpusModel, seed: int = 0):
    """The torch module and an example input (seeded weights; nothing downloaded)."""
    import torch

    from .. import zoo

    zoo._offline()
    torch.manual_seed(seed)
    module = getattr(zoo, model.builder)(**model.kwargs).eval()
    if model.input_dtype == "int64":
        example = torch.zeros(model.input_shape, dtype=torch.int64)
    else:
        example = torch.rand(model.input_shape)
    return module, example


def extract_tasks(model: CorpusModel, seed: int = 0) -> list[dict]:
    """The model's distinct tasks: key, name, calls, num_outputs, the PrimFunc's TVMScript and
    its language description (plain dicts for the store)."""
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    from ..frontend.torch_rewrites import average_pool_covering_input_to_mean
    from ..graph import fuse_to_tir, partition
    from ..tlm.language import describe_task

    module, example = build_module(model, seed)
    with torch.no_grad():
        ep = torch.export.export(module, (example,)).run_decompositions()
    average_pool_covering_input_to_mean(ep)  # what `tlmpack build` compiles (frontend/torch.py)
    del module
    mod = from_exported_program(ep, keep_params_as_input=False, unwrap_unit_return_tuple=True)
    del ep
    graph = partition(fuse_to_tir(mod))
    outputs = {}
    for call in graph.calls:
        outputs[call.task] = call.num_outputs
    tasks = []
    for task in graph.tasks:
        func = graph.task_funcs[task.id]
        info = describe_task(func, task.name)
        script = func.script()
        tasks.append({
            "key": task_key(func), "name": task.name, "calls": task.calls, "num_outputs": outputs[task.id],
            "script": script, "script_sha256": hashlib.sha256(script.encode()).hexdigest(),
            "first_model": model.name, "kind": info.kind, "ops": list(info.ops), "spatial": list(info.spatial),
            "reduction": list(info.reduction), "dtypes": list(info.dtypes),
        })
    return tasks


def load_func(task: dict):
    """The task's unscheduled PrimFunc back from its stored TVMScript."""
    import tvm
    from tvm.script import from_source

    parsed = from_source(task["script"])
    return parsed["main"] if isinstance(parsed, tvm.IRModule) else parsed
