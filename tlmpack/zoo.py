"""Seed models for tests and benchmarks, built offline with seeded random weights.

Every model is constructed from a ``transformers`` config class (or plain torch for ``mlp``)
with ``torch.manual_seed(seed)`` right before construction, put in eval mode, and wrapped so
that it takes exactly the named inputs and returns exactly one tensor. Nothing is downloaded.

* Vision models take ``pixel_values`` float32 [1, 3, 224, 224] and return ``logits``.
* Text models take only ``input_ids`` int64 [1, seq]; eager attention, no KV cache. Position
  ids, token type ids (BERT) and the causal mask (GPT-2, LLaMA; an additive [1, 1, seq, seq]
  constant) are constant buffers of the wrapper, so the graph holds no mask arithmetic.
  BERT returns ``last_hidden_state``, GPT-2/LLaMA ``logits``.
* transformers initialises biases to 0, norm scales to 1 and BatchNorm statistics to (0, 1);
  those tensors get small seeded noise (``_perturb_constant_tensors``) so that a compiler bug
  that drops a bias/affine/BN would show up as a mismatch.
* ONNX: TorchScript exporter (``dynamo=False``), opset 17, constant folding, fixed shapes, then
  ``_simplify`` removes what that exporter leaves (foldable Gathers/Shape chains, no-op Cast,
  Identity, zero Pad). Exports are byte-for-byte reproducible.

API::

    names()                                   -> list of model names
    get_model(name, seed=0)                   -> (module, example_inputs, input_names, output_names)
    random_inputs(name, seed=0)               -> {input_name: np.ndarray}   (live inputs)
    export_onnx(name, path, opset=17, seed=0) -> dict with time_s, size_bytes, op_types, ...
    check_onnx(name, path, seed=0)            -> dict with rel_err, output stats (ORT vs torch)
    torch_factory(name)                       -> zero-arg callable returning (module, example_inputs)
    <name>_factory                            -> e.g. ``tlmpack.zoo:mlp_factory``, ``tlmpack.zoo:bert_tiny_factory``

Importing this module is cheap: torch, transformers, onnx and onnxruntime are imported only
inside functions.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_SEED = 0
DEFAULT_OPSET = 17
# Protobuf cannot hold a single message over 2 GiB; bigger models keep weights in NAME.onnx.data.
_PROTO_LIMIT = 2**31 - 1024 * 1024


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # "int64" | "float32"
    high: int = 0  # exclusive upper bound for int64 token ids (the vocab size)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    builder: str  # name of the _build_* function in this module
    inputs: tuple[InputSpec, ...]
    outputs: tuple[str, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    tiny: bool = False
    description: str = ""


def _img(size: int = 224) -> tuple[InputSpec, ...]:
    return (InputSpec("pixel_values", (1, 3, size, size), "float32"),)


def _ids(seq: int, vocab: int) -> tuple[InputSpec, ...]:
    return (InputSpec("input_ids", (1, seq), "int64", vocab),)


_BERT_VOCAB = 30522
_GPT2_VOCAB = 50257
_LLAMA_VOCAB = 32000


def _bert(name: str, seq: int, hidden: int, layers: int, heads: int, ffn: int, description: str,
          tiny: bool = False) -> ModelSpec:
    """An HF BertModel encoder over ``seq`` token ids, output last_hidden_state."""
    return ModelSpec(name, "_build_bert", _ids(seq, _BERT_VOCAB), ("last_hidden_state",),
                     dict(seq=seq, vocab_size=_BERT_VOCAB, hidden_size=hidden, num_hidden_layers=layers,
                          num_attention_heads=heads, intermediate_size=ffn),
                     tiny=tiny, description=description)

MODELS: dict[str, ModelSpec] = {
    s.name: s
    for s in [
        # ---- full-size seed models (benchmarks) ----
        ModelSpec(
            "resnet50",
            "_build_resnet",
            _img(),
            ("logits",),
            dict(
                embedding_size=64,
                hidden_sizes=[256, 512, 1024, 2048],
                depths=[3, 4, 6, 3],
                layer_type="bottleneck",
                num_labels=1000,
            ),
            description="ResNet-50 (HF ResNetForImageClassification), 1000 classes",
        ),
        ModelSpec(
            "mobilenetv2",
            "_build_mobilenetv2",
            _img(),
            ("logits",),
            dict(depth_multiplier=1.0, image_size=224, num_labels=1000),
            description="MobileNetV2 1.0/224 (HF MobileNetV2ForImageClassification, tf_padding)",
        ),
        ModelSpec(
            "efficientnet-b0",
            "_build_efficientnet",
            _img(),
            ("logits",),
            dict(
                width_coefficient=1.0,
                depth_coefficient=1.0,
                image_size=224,
                hidden_dim=1280,
                dropout_rate=0.2,
                num_labels=1000,
            ),
            description="EfficientNet-B0 (HF EfficientNetForImageClassification)",
        ),
        _bert("bert-base", 128, 768, 12, 12, 3072,
              "BERT-base encoder (HF BertModel), seq 128, output last_hidden_state"),
        ModelSpec(
            "gpt2",
            "_build_gpt2",
            _ids(128, _GPT2_VOCAB),
            ("logits",),
            dict(seq=128, vocab_size=_GPT2_VOCAB, n_layer=12, n_embd=768, n_head=12),
            description="GPT-2 small (HF GPT2LMHeadModel, tied LM head), seq 128, output logits",
        ),
        ModelSpec(
            "llama-2l-4096",
            "_build_llama",
            _ids(128, _LLAMA_VOCAB),
            ("logits",),
            dict(
                seq=128,
                vocab_size=_LLAMA_VOCAB,
                hidden_size=4096,
                intermediate_size=11008,
                num_hidden_layers=2,
                num_attention_heads=32,
                num_key_value_heads=32,
                max_position_embeddings=2048,
            ),
            description="2-layer LLaMA-7B-shaped decoder (HF LlamaForCausalLM), seq 128, output logits; "
            "~2.7 GB of fp32 weights, stored as external data NAME.onnx.data",
        ),
        _bert("encoder-197", 197, 768, 12, 12, 3072,
              "BERT-base-shaped encoder over 197 tokens (a ViT-B/16 sequence: 196 patches + CLS; "
              "197 is prime), output last_hidden_state"),
        # ---- tiny variants (CI) ----
        ModelSpec(
            "resnet-tiny",
            "_build_resnet",
            _img(),
            ("logits",),
            dict(
                embedding_size=16,
                hidden_sizes=[16, 32, 64, 128],
                depths=[1, 1, 1, 1],
                layer_type="basic",
                num_labels=10,
            ),
            tiny=True,
            description="tiny ResNet (basic blocks, widths 16..128, one block per stage), 10 classes",
        ),
        _bert("bert-tiny", 32, 128, 2, 2, 512, "BERT 2 layers, hidden 128, 2 heads, seq 32", tiny=True),
        _bert("encoder-77-tiny", 77, 128, 2, 2, 512,
              "BERT 2 layers, hidden 128, 2 heads, seq 77 (7 x 11: awkward rows and keys)", tiny=True),
        ModelSpec(
            "gpt2-tiny",
            "_build_gpt2",
            _ids(32, _GPT2_VOCAB),
            ("logits",),
            dict(seq=32, vocab_size=_GPT2_VOCAB, n_layer=2, n_embd=64, n_head=2),
            tiny=True,
            description="GPT-2 2 layers, n_embd 64, 2 heads, seq 32, output logits",
        ),
        ModelSpec(
            "mlp",
            "_build_mlp",
            (InputSpec("x", (4, 64), "float32"),),
            ("y",),
            dict(sizes=[64, 128, 128, 10]),
            tiny=True,
            description="plain torch MLP 64-128-128-10 (Linear/ReLU/Linear/GELU/Linear), batch 4",
        ),
    ]
}

BENCH_DEFAULT = ["resnet50", "mobilenetv2", "bert-base", "gpt2"]


def names(tiny: bool | None = None) -> list[str]:
    """All model names; ``tiny=True`` only the CI variants, ``tiny=False`` only the full ones."""
    return [n for n, s in MODELS.items() if tiny is None or s.tiny == tiny]


def spec(name: str) -> ModelSpec:
    """The spec of ``name``; ``name@bN`` is the same model at batch N (same weights)."""
    import dataclasses

    base, _, batch = name.partition("@b")
    try:
        model = MODELS[base]
    except KeyError:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(MODELS)} (optionally @bN)") from None
    if not batch:
        return model
    if not batch.isdigit() or int(batch) < 1:
        raise KeyError(f"{name!r}: the batch suffix must be @b<positive integer>")
    inputs = tuple(dataclasses.replace(i, shape=(int(batch), *i.shape[1:])) for i in model.inputs)
    return dataclasses.replace(model, name=name, inputs=inputs)


# --------------------------------------------------------------------------------------------
# builders (all heavy imports happen here)
# --------------------------------------------------------------------------------------------


def _offline() -> None:
    # Belt and braces: nothing in here should ever touch the hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _wrap_vision(model):
    """A module ``forward(pixel_values) -> logits`` around a transformers image classifier.

    The argument is named like the ONNX input, so torch.export (``tlmpack.zoo:*_factory``) and the
    ONNX export agree on input names.
    """
    import torch

    class _Vision(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, pixel_values):
            # ModelOutput (transformers) indexes positionally: [0] is logits.
            return self.inner(pixel_values=pixel_values)[0]

    return _Vision(model).eval()


def _wrap_text(model, seq: int, causal: bool, token_types: bool = False):
    """Wrap a transformers text model so that it takes only ``input_ids`` [1, seq].

    Everything else the model would derive from the input at run time is handed in as a constant
    buffer, so that the exported graph holds no mask/position arithmetic:
    ``position_ids`` (arange), ``token_type_ids`` (zeros, BERT) and, for decoders, a prepared 4-D
    additive causal mask [1, 1, seq, seq] (0 on/below the diagonal, float32 min above), which
    transformers passes through as-is (one ``Add`` per attention layer). Encoders get no mask at all.
    """
    import torch

    class _Text(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            self.register_buffer(
                "zoo_position_ids", torch.arange(seq, dtype=torch.int64)[None], persistent=False
            )
            if token_types:
                self.register_buffer(
                    "zoo_token_type_ids", torch.zeros(1, seq, dtype=torch.int64), persistent=False
                )
            if causal:
                allowed = torch.ones(seq, seq, dtype=torch.bool).tril()
                mask = torch.zeros(seq, seq).masked_fill(~allowed, torch.finfo(torch.float32).min)
                self.register_buffer("zoo_causal_mask", mask[None, None], persistent=False)
            self.causal = causal
            self.token_types = token_types

        def forward(self, input_ids):
            kw = dict(input_ids=input_ids, position_ids=self.zoo_position_ids)
            if self.token_types:
                kw["token_type_ids"] = self.zoo_token_type_ids
            if self.causal:
                kw["attention_mask"] = self.zoo_causal_mask
            return self.inner(**kw)[0]

    return _Text(model).eval()


def _hf_common() -> dict[str, Any]:
    # return_dict stays at its default: transformers 5 breaks GPT2LMHeadModel with return_dict=False
    # (it reads .last_hidden_state off the inner tuple); the wrapper indexes the ModelOutput instead.
    return dict(use_cache=False, attn_implementation="eager")


def _build_resnet(**kw):
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(**kw)
    return _wrap_vision(ResNetForImageClassification(cfg))


def _build_mobilenetv2(**kw):
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    cfg = MobileNetV2Config(**kw)
    return _wrap_vision(MobileNetV2ForImageClassification(cfg))


def _build_efficientnet(**kw):
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    cfg = EfficientNetConfig(**kw)
    return _wrap_vision(EfficientNetForImageClassification(cfg))


def _build_bert(seq, **kw):
    from transformers import BertConfig, BertModel

    cfg = BertConfig(**kw, **_hf_common())
    return _wrap_text(BertModel(cfg, add_pooling_layer=False), seq, causal=False, token_types=True)


def _build_gpt2(seq, **kw):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(**kw, **_hf_common())
    return _wrap_text(GPT2LMHeadModel(cfg), seq, causal=True)


def _build_llama(seq, **kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**kw, **_hf_common())
    return _wrap_text(LlamaForCausalLM(cfg), seq, causal=True)


def _build_mlp(sizes):
    import torch

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            layers: list[torch.nn.Module] = []
            acts = [torch.nn.ReLU, torch.nn.GELU]
            for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
                layers.append(torch.nn.Linear(a, b))
                if i < len(sizes) - 2:
                    layers.append(acts[i % len(acts)]())
            self.layers = torch.nn.Sequential(*layers)

        def forward(self, x):  # named like the ONNX input
            return self.layers(x)

    return MLP().eval()


def _perturb_constant_tensors(model, seed: int) -> None:
    """Give every constant-initialised float tensor (biases, norm scales, BatchNorm statistics) small
    seeded noise.

    transformers initialises biases to 0, norm weights to 1 and BatchNorm running stats to (0, 1).
    With those values a compiler bug that drops a bias, a norm affine or a BN fold would go unnoticed,
    and the TorchScript exporter deduplicates the identical tensors into ``Identity`` nodes. Noise:
    biases/shifts/running_mean ~ N(0, 0.05^2); scales ~ 1 + N(0, 0.1^2); running_var ~ U(0.5, 1.5).
    Buffers added by the zoo wrappers (``zoo_*``) are left alone.
    """
    import torch

    g = torch.Generator().manual_seed(seed * 1000003 + 17)
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    with torch.no_grad():
        for name, t in tensors:
            if name.split(".")[-1].startswith("zoo_") or not t.is_floating_point() or t.numel() < 2:
                continue
            flat = t.reshape(-1)
            if not bool((flat == flat[0]).all()):
                continue
            v = float(flat[0])
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif v == 0.0:
                t.add_(torch.randn(t.shape, generator=g) * 0.05)
            elif v == 1.0:
                t.add_(torch.randn(t.shape, generator=g) * 0.1)


WEIGHT_MODES = ("dense", "portable")


def _portable_weights(model, seed: int, density: float = 1 / 16, gain: float = 1.0) -> None:
    """Replace every float parameter and buffer with values drawn by numpy (PCG64), keyed by the
    tensor's name, so the model is the same under any torch/transformers version, and its weights
    compress about 30x (for carrying artifacts to a GPU machine).

    Matrices and kernels (ndim >= 2) are sparse: a ``density`` fraction of entries holds k/8 for
    k in [-8, 8] \\ {0}, scaled to He-like std sqrt(2 / fan_in) (embeddings: 0.05). Sparse random
    weights still catch indexing errors: a wrong element is almost never the same as the right one.
    1-D tensors are dense: shifts ~ N(0, 0.05), scales ~ 1 + N(0, 0.1), running_var ~ U(0.5, 1.5).
    Buffers added by the zoo wrappers (``zoo_*``) are left alone.
    """
    import zlib

    import numpy as np
    import torch

    tensors = list(model.named_parameters()) + list(model.named_buffers())
    with torch.no_grad():
        for name, t in tensors:
            if name.split(".")[-1].startswith("zoo_") or not t.is_floating_point():
                continue
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            shape = tuple(t.shape)
            if len(shape) >= 2:
                embedding = any(key in name for key in ("embed", "wte", "wpe"))
                fan_in = int(np.prod(shape[1:]))
                dense_enough = min(1.0, max(density, 16.0 / fan_in))  # small kernels stay mostly dense
                k = rng.integers(1, 9, size=shape) * rng.choice(np.array([-1, 1]), size=shape)
                values = np.where(rng.random(shape) < dense_enough, k / 8.0, 0.0)
                std = 0.05 if embedding else gain / np.sqrt(fan_in)
                values *= std / np.sqrt(dense_enough * np.mean((np.arange(1, 9) / 8.0) ** 2))
            elif name.endswith("running_var"):
                values = rng.uniform(0.5, 1.5, size=shape)
            else:
                center = 1.0 if name.endswith("weight") else 0.0  # 1-D weights are norm scales
                values = center + rng.standard_normal(shape) * (0.1 if center else 0.05)
            t.copy_(torch.from_numpy(np.asarray(values, dtype=np.float32)).to(t.dtype))


def _calibrate_batchnorm(model, name: str, seed: int, passes: int = 4) -> None:
    """Set BatchNorm running statistics to the activations' real ones (rounded to bf16 precision).

    Random weights with made-up running statistics let the signal decay block after block: BN in
    eval mode does not renormalise, so the per-channel shifts swamp it and the output of a deep net
    (MobileNetV2, EfficientNet) stops depending on the input. Calibrated BN keeps it live.
    """
    import numpy as np
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for bn in norms:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average over the calibration passes
        bn.train()
    with torch.no_grad():
        for i in range(passes):
            feed = random_inputs(name, seed + 7919 + i)
            model(*(torch.from_numpy(feed[inp.name]) for inp in spec(name).inputs))
    for bn in norms:
        bn.eval()
        for stat in (bn.running_mean, bn.running_var):
            rounded = np.asarray(stat.float().numpy(), dtype=np.float32).view(np.uint32) + 0x8000
            stat.copy_(torch.from_numpy((rounded & 0xFFFF0000).view(np.float32)))


def random_inputs(name: str, seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """A live input set: token ids uniform in [0, vocab), images/features ~ N(0, 1)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    feed = {}
    for inp in spec(name).inputs:
        if inp.dtype == "int64":
            feed[inp.name] = rng.integers(0, inp.high, size=inp.shape, dtype=np.int64)
        else:
            feed[inp.name] = rng.standard_normal(inp.shape).astype(inp.dtype)
    return feed


def batchnorm_stats(model) -> dict[str, Any]:
    """The BatchNorm running statistics by buffer name (what calibration computed)."""
    import torch

    return {f"{n}.{stat}": getattr(m, stat).numpy().copy()
            for n, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
            for stat in ("running_mean", "running_var")}


def get_model(name: str, seed: int = DEFAULT_SEED, weights: str = "dense", bn_stats: dict | None = None):
    """Build ``name`` with seeded random weights (``weights="portable"``: see _portable_weights).

    Returns ``(module, example_inputs, input_names, output_names)``; ``module`` is in eval mode and
    ``module(*example_inputs)`` returns a single tensor.
    """
    import numpy as np
    import torch

    _offline()
    s = spec(name)
    torch.manual_seed(seed)
    model = globals()[s.builder](**s.kwargs)
    model.eval()
    if weights == "portable":
        _portable_weights(model, seed)
    elif weights == "dense":
        _perturb_constant_tensors(model, seed)
    else:
        raise ValueError(f"weights must be one of {WEIGHT_MODES}, got {weights!r}")
    if bn_stats is None:
        _calibrate_batchnorm(model, name.partition("@b")[0], seed)  # the same weights at every batch
    else:  # calibration runs torch's own kernels: another torch may round a statistic differently
        for key, value in bn_stats.items():
            module_name, _, stat = key.rpartition(".")
            with torch.no_grad():
                getattr(model.get_submodule(module_name), stat).copy_(torch.from_numpy(np.asarray(value)))
    for p in model.parameters():
        p.requires_grad_(False)
    return model, _example(name, seed), [i.name for i in s.inputs], list(s.outputs)


def _example(name: str, seed: int):
    import torch

    feed = random_inputs(name, seed)
    return tuple(torch.from_numpy(feed[i.name]) for i in spec(name).inputs)


def torch_factory(name: str, seed: int = DEFAULT_SEED) -> Callable[[], tuple[Any, tuple]]:
    """A zero-argument factory returning ``(module, example_inputs)`` for the torch.export frontend."""

    def factory():
        model, example, _, _ = get_model(name, seed)
        return model, example

    factory.__name__ = _factory_name(name)
    factory.__qualname__ = factory.__name__
    factory.__doc__ = f"(module, example_inputs) for zoo model {name!r} (seed {seed})."
    return factory


def _factory_name(name: str) -> str:
    return name.replace("-", "_") + "_factory"


# Module-level factories, e.g. "tlmpack.zoo:mlp_factory", "tlmpack.zoo:bert_tiny_factory".
for _n in MODELS:
    globals()[_factory_name(_n)] = torch_factory(_n)
del _n


# --------------------------------------------------------------------------------------------
# ONNX export and checks
# --------------------------------------------------------------------------------------------


def _torch_forward(model, example):
    import torch

    with torch.no_grad():
        out = model(*example)
    return out.detach().cpu().numpy()


def export_onnx(
    name: str,
    path: str | os.PathLike,
    opset: int = DEFAULT_OPSET,
    seed: int = DEFAULT_SEED,
    dynamo: bool = False,
    simplify: bool = True,
    model=None,
    weights: str = "dense",
) -> dict[str, Any]:
    """Export ``name`` to ONNX at ``path`` with fixed shapes and folded constants.

    Uses the legacy TorchScript exporter (``dynamo=False``) by default, then ``_simplify`` (constant
    folding of what the exporter left, no-op Cast/Identity removal). ``model`` may be passed to reuse a
    module already built by ``get_model(name, seed)``. Models over 2 GiB keep their
    weights in one external file ``<path>.data`` next to the model. The output is deterministic for a
    given (name, opset, seed). Returns ``dict(name, path, time_s, size_bytes, data_bytes, op_types,
    num_nodes, opset)``.
    """
    import tempfile
    import warnings

    import onnx
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if model is None:
        model, example, in_names, out_names = get_model(name, seed, weights)
    else:  # a module already built by get_model(name, seed)
        s = spec(name)
        in_names, out_names = [i.name for i in s.inputs], list(s.outputs)
        example = _example(name, seed)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tlm_zoo_") as tmp:
        tmp_path = Path(tmp) / "model.onnx"
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            kw: dict[str, Any] = dict(
                input_names=in_names,
                output_names=out_names,
                opset_version=opset,
                do_constant_folding=True,
                dynamo=dynamo,
            )
            if dynamo:
                kw.update(external_data=True, optimize=True)
            torch.onnx.export(model, example, str(tmp_path), **kw)
        # Re-save: one self-contained file, or model + one .data file when over the protobuf limit.
        proto = onnx.load(str(tmp_path), load_external_data=True)
    _normalize(proto)
    simplify_stats = _simplify(proto) if simplify else {}
    data_path = path.with_name(path.name + ".data")
    if data_path.exists():
        data_path.unlink()
    if _approx_size(proto) > _PROTO_LIMIT:
        onnx.save_model(
            proto,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data_path.name,
            size_threshold=1024,
        )
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(data_path, 0o666 & ~umask)  # onnx creates it 0600; make it as readable as the .onnx
    else:
        onnx.save_model(proto, str(path))
    dt = time.perf_counter() - t0
    graph = onnx.load(str(path), load_external_data=False).graph
    return dict(
        name=name,
        path=str(path),
        opset=opset,
        time_s=dt,
        size_bytes=path.stat().st_size,
        data_bytes=data_path.stat().st_size if data_path.exists() else 0,
        op_types=sorted({n.op_type for n in graph.node}),
        op_counts=_op_counts(graph),
        num_nodes=len(graph.node),
        simplify=simplify_stats,
    )


def _normalize(proto) -> None:
    """Strip version-dependent metadata so that exports are byte-for-byte reproducible."""
    proto.producer_version = ""
    proto.doc_string = ""
    proto.graph.doc_string = ""


_FOLD_LIMIT_BYTES = 256 << 20


def _simplify(proto, max_passes: int = 4) -> dict[str, int]:
    """Small, semantics-preserving clean-ups the TorchScript exporter leaves behind.

    Repeated until nothing changes:

    * shape inference (weights enter as typed inputs, so nothing big is copied);
    * ``Shape`` of a statically shaped tensor becomes a constant (fixed shapes everywhere);
    * nodes whose inputs are all constant are folded (e.g. ``Gather(position_embeddings, Constant)``,
      ``Shape -> Gather -> Unsqueeze -> Concat`` chains), when inputs and result are at most 256 MiB;
    * no-op ``Cast`` nodes (``.to(same dtype)`` in the model code), ``Identity`` nodes and all-zero
      ``Pad`` nodes (MobileNetV2's TF-style padding before 1x1 convs) are dropped;
    * initializers and nodes nothing uses any more are removed.

    Graph inputs/outputs keep their names. Returns counts of what was done.
    """
    stats = dict(folded=0, shapes=0, casts=0, identities=0, pads=0, removed_initializers=0, passes=0)
    for _ in range(max_passes):
        before = dict(stats)
        _simplify_pass(proto, stats)
        stats["passes"] += 1
        if all(stats[k] == before[k] for k in ("folded", "shapes", "casts", "identities", "pads")):
            break
    return stats


def _simplify_pass(proto, stats: dict[str, int]) -> None:
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    g = proto.graph
    opset = [helper.make_opsetid(o.domain, o.version) for o in proto.opset_import]
    graph_outputs = {o.name for o in g.output}
    inits = {t.name: t for t in g.initializer}
    # Constant nodes (value attribute only) count as constants too.
    for n in g.node:
        if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value":
            inits.setdefault(n.output[0], n.attribute[0].t)

    # Shape inference without copying the weights: big initializers enter as typed graph inputs, small
    # ones (shapes, pads, axes: inference reads their values) as initializers.
    small = [t for t in g.initializer if _numel(t.dims) <= 64]
    typed_inits = [
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in g.initializer
        if _numel(t.dims) > 64
    ]
    inferred = onnx.shape_inference.infer_shapes(
        helper.make_model(
            helper.make_graph(list(g.node), "t", list(g.input) + typed_inits, list(g.output), small),
            opset_imports=opset,
        ),
        strict_mode=False,
    )
    elem: dict[str, int] = {}
    static_shape: dict[str, list[int]] = {}
    for v in list(inferred.graph.value_info) + list(g.input) + list(g.output):
        tt = v.type.tensor_type
        elem[v.name] = tt.elem_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            static_shape[v.name] = [d.dim_value for d in tt.shape.dim]
    for t in g.initializer:
        elem[t.name] = t.data_type

    def add_const(name, value):
        t = numpy_helper.from_array(np.asarray(value), name)
        g.initializer.append(t)
        inits[name] = t

    nondeterministic = {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
    }
    rename: dict[str, str] = {}
    kept = []
    for n in g.node:
        ins = [rename.get(i, i) for i in n.input]
        del n.input[:]
        n.input.extend(ins)
        outs_are_graph_outputs = any(o in graph_outputs for o in n.output)
        std_domain = n.domain in ("", "ai.onnx")
        # Shape of a statically shaped tensor.
        if n.op_type == "Shape" and std_domain and not outs_are_graph_outputs and n.input[0] in static_shape:
            shp = static_shape[n.input[0]]
            start = next((a.i for a in n.attribute if a.name == "start"), 0)
            end = next((a.i for a in n.attribute if a.name == "end"), len(shp))
            add_const(n.output[0], np.array(shp[start:end], dtype=np.int64))
            stats["shapes"] += 1
            continue
        # All-constant node.
        if (
            n.op_type != "Constant"
            and std_domain
            and n.input
            and all(i and i in inits for i in n.input)
            and not outs_are_graph_outputs
            and n.op_type not in nondeterministic
        ):
            names = list(dict.fromkeys(n.input))
            vals = {i: numpy_helper.to_array(inits[i]) for i in names}
            if sum(v.nbytes for v in vals.values()) <= _FOLD_LIMIT_BYTES:
                sub = helper.make_model(
                    helper.make_graph(
                        [n],
                        "fold",
                        [
                            helper.make_tensor_value_info(i, inits[i].data_type, list(inits[i].dims))
                            for i in names
                        ],
                        [
                            helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
                            for o in n.output
                        ],
                    ),
                    opset_imports=opset,
                )
                try:
                    outs = ReferenceEvaluator(sub).run(None, vals)
                except Exception:
                    outs = None
                if outs is not None and sum(np.asarray(o).nbytes for o in outs) <= _FOLD_LIMIT_BYTES:
                    for name, val in zip(n.output, outs, strict=True):
                        add_const(name, val)
                    stats["folded"] += 1
                    continue
        # No-op Cast / Identity: consumers read the producer directly.
        if n.output and not outs_are_graph_outputs and std_domain:
            if n.op_type == "Identity":
                rename[n.output[0]] = n.input[0]
                stats["identities"] += 1
                continue
            if n.op_type == "Cast":
                to = next(a.i for a in n.attribute if a.name == "to")
                if elem.get(n.input[0]) == to:
                    rename[n.output[0]] = n.input[0]
                    stats["casts"] += 1
                    continue
            if n.op_type == "Pad" and len(n.input) > 1 and n.input[1] in inits:
                if not numpy_helper.to_array(inits[n.input[1]]).any():
                    rename[n.output[0]] = n.input[0]
                    stats["pads"] += 1
                    continue
        kept.append(n)

    # Dead code: drop nodes and initializers nothing reaches.
    used = set(graph_outputs)
    live = []
    for n in reversed(kept):
        if any(o in used for o in n.output):
            live.append(n)
            used.update(i for i in n.input if i)
    live.reverse()
    del g.node[:]
    g.node.extend(live)
    keep_inits = [t for t in g.initializer if t.name in used]
    stats["removed_initializers"] += len(g.initializer) - len(keep_inits)
    del g.initializer[:]
    g.initializer.extend(keep_inits)
    del g.value_info[:]


def _approx_size(proto) -> int:
    """Bytes of weight data plus a generous allowance for the graph (``ByteSize()`` takes seconds)."""
    data = sum(len(t.raw_data) or _numel(t.dims) * 8 for t in proto.graph.initializer)
    return data + 64 * 1024 * 1024


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _op_counts(graph) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in graph.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return dict(sorted(counts.items()))


def rel_err(got, ref) -> float:
    """max |got - ref| / max |ref| (the error measure used by tests and benchmarks)."""
    import numpy as np

    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    denom = float(np.max(np.abs(ref))) if ref.size else 0.0
    return float(np.max(np.abs(got - ref)) / max(denom, 1e-30))


def liveness(out) -> dict[str, Any]:
    """Statistics used to judge that an output is 'live' (not saturated / degenerate)."""
    import numpy as np

    a = np.asarray(out, dtype=np.float64)
    flat = a.reshape(-1, a.shape[-1]) if a.ndim >= 2 else a.reshape(1, -1)
    finite = bool(np.all(np.isfinite(a)))
    std = float(a.std()) if finite else float("nan")
    # Rows (tokens / batch items) must differ from each other, and values within a row too.
    row_std = float(flat.std(axis=1).min()) if finite else float("nan")
    across = float(flat.std(axis=0).mean()) if finite and flat.shape[0] > 1 else float("nan")
    live = finite and std > 1e-6 and row_std > 1e-6 and (flat.shape[0] == 1 or across > 1e-6)
    return dict(
        finite=finite,
        std=std,
        min_row_std=row_std,
        across_rows_std=across,
        frac_zero=float(np.mean(a == 0)) if a.size else 1.0,
        live=live,
    )


def ort_session(path: str | os.PathLike, num_threads: int = 0):
    import onnxruntime as ort

    so = ort.SessionOptions()
    if num_threads:
        so.intra_op_num_threads = num_threads
        so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def check_onnx(
    name: str, path: str | os.PathLike, seed: int = DEFAULT_SEED, model=None, return_outputs: bool = False
) -> dict[str, Any]:
    """Run the exported model in onnxruntime on ``random_inputs(name, seed)`` and compare to torch.

    ``ok`` means: live output (finite, nonzero std, rows differ) and rel_err (max-abs / max-abs-ref)
    below 1e-4. With ``return_outputs`` the result also holds ``feed``, ``torch_out`` and ``ort_out``.
    """
    if model is None:
        model, _, _, _ = get_model(name, seed)
    feed = random_inputs(name, seed)
    t0 = time.perf_counter()
    ref = _torch_forward(model, _example(name, seed))
    t_torch = time.perf_counter() - t0
    sess = ort_session(path)
    t0 = time.perf_counter()
    got = sess.run(None, feed)[0]
    t_ort = time.perf_counter() - t0
    res = dict(
        name=name,
        shape=list(got.shape),
        rel_err=rel_err(got, ref),
        torch_s=t_torch,
        ort_first_run_s=t_ort,
        **liveness(got),
    )
    res["ok"] = bool(res["live"] and res["rel_err"] < 1e-4 and list(ref.shape) == list(got.shape))
    if return_outputs:
        res.update(feed=feed, torch_out=ref, ort_out=got)
    return res
