"""The TLM: a transformers GPT2LMHeadModel over the tensor language's fixed vocabulary, and its
shipped weights (package data: tlmpack/tlm/weights/<target>.safetensors).

A weights file carries, in its safetensors metadata, the vocabulary hash it was trained on (a
file of another vocabulary is refused, never misread) and the training summary the decoder uses
to tell an out-of-distribution task (kinds, op words and extent ranges seen in training) and a
low-confidence decode (its threshold). The model id is the file's sha256, so a manifest names the
exact bytes that scheduled it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .language import LANGUAGE_VERSION, TOKEN_ID, VOCAB, VOCAB_SHA256

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
TARGETS = ("x86", "cuda")


@dataclass(frozen=True)
class ModelShape:
    """The GPT-2's size: small enough to decode a whole model's tasks on a 2-core CPU in well
    under a second (about 1.5 M parameters, 6 MB in fp32)."""

    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    n_positions: int = 160  # longest sentence: about 110 tokens (8 tile decisions of 4 factors)

    def config(self):
        from transformers import GPT2Config

        return GPT2Config(vocab_size=len(VOCAB), n_positions=self.n_positions, n_embd=self.n_embd,
                          n_layer=self.n_layer, n_head=self.n_head, bos_token_id=TOKEN_ID["[BOS]"],
                          eos_token_id=TOKEN_ID["[EOS]"], pad_token_id=TOKEN_ID["[PAD]"],
                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True)


@dataclass(frozen=True)
class TrainingSummary:
    """What the model saw in training: the decoder falls back to the rules outside it."""

    target: str
    kinds: tuple[str, ...] = ()
    ops: tuple[str, ...] = ()
    # kind -> [min, max] of the product of the spatial and of the reduction extents
    extent_range: dict[str, list[int]] = field(default_factory=dict)
    min_confidence: float = 0.0  # geometric-mean probability of the chosen values, below: fallback
    tasks: int = 0
    sentences: int = 0
    seed: int = 0
    data: str = ""  # sha256 of the training set's sentences
    space_version: int = 1  # schedule.space.SPACE_VERSIONS: the sketches its training sentences covered
    guided: bool = False  # its sentences start with the rules' schedule (language.Hint)
    anchor_margin: float = 0.0  # > 0: greedy keeps the rules' token unless the model's beats it by this (log-prob)
    # x86: the vector widths (bits) of the machines its sentences were measured on; a target of
    # another width is out of distribution (empty: not recorded, no test)
    vector_bits: tuple[int, ...] = ()
    # x86: a build hands it channels-last convolutions (the x86 build's layout). `tlm train` sets it
    # when its sentences held such tasks; False (and weights that predate it): they go to the rules.
    # A policy like min_confidence: whole seed models may show it should be cleared (docs/tlm.md).
    channels_last: bool = False

    def to_json(self) -> dict:
        return asdict(self) | {"kinds": list(self.kinds), "ops": list(self.ops), "vector_bits": list(self.vector_bits)}

    @staticmethod
    def from_json(d: dict) -> TrainingSummary:
        return TrainingSummary(**{**d, "kinds": tuple(d.get("kinds", ())), "ops": tuple(d.get("ops", ())),
                                  "vector_bits": tuple(d.get("vector_bits", ()))})


@dataclass(frozen=True)
class LoadedTLM:
    """A model ready to decode (``net``: the numpy forward pass), with what the manifest records of it."""

    net: Any  # numpy_gpt2.NumpyGPT2
    state: dict  # name -> numpy array, as stored (lm_head tied to the token embedding)
    target: str
    sha256: str
    summary: TrainingSummary
    shape: ModelShape

    @property
    def id(self) -> str:
        return f"tlm-{self.target}-v{LANGUAGE_VERSION}-{self.sha256[:12]}"

    def to_json(self) -> dict:
        return {"id": self.id, "sha256": self.sha256, "target": self.target, "language_version": LANGUAGE_VERSION,
                "vocab_sha256": VOCAB_SHA256, "training": self.summary.to_json()}

    def torch_model(self):
        """The same weights as a transformers GPT2LMHeadModel (training, tests)."""
        import torch

        model = new_model(self.shape)
        state = {k: torch.from_numpy(v.copy()) for k, v in self.state.items()}
        state["lm_head.weight"] = state["transformer.wte.weight"]
        model.load_state_dict(state, strict=False)
        model.tie_weights()
        return model.eval()


class TLMUnavailable(Exception):
    """No usable weights for a target (missing file, other vocabulary): the build uses the rules."""


def new_model(shape: ModelShape = ModelShape(), seed: int = 0):
    """A freshly initialised GPT-2 (seeded)."""
    import torch
    from transformers import GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(shape.config())


def weights_path(target: str) -> Path:
    return WEIGHTS_DIR / f"{target}.safetensors"


def save(model, path: Path, shape: ModelShape, summary: TrainingSummary) -> str:
    """Writes the weights with their vocabulary hash and training summary; returns the sha256."""
    from safetensors.torch import save_file

    state = {k: v.detach().to("cpu").contiguous().float() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}  # tied to the token embedding
    metadata = {"format": "tlmpack-tlm", "language_version": str(LANGUAGE_VERSION), "vocab_sha256": VOCAB_SHA256,
                "shape": json.dumps(asdict(shape), sort_keys=True),
                "summary": json.dumps(summary.to_json(), sort_keys=True)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(dict(sorted(state.items())), str(tmp), metadata=metadata)
    tmp.replace(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_file(path: Path, target: str) -> LoadedTLM:
    """Loads one weights file with numpy alone (no torch: a build that only decodes stays light);
    TLMUnavailable when it is missing or of another vocabulary."""
    from safetensors import safe_open
    from safetensors.numpy import load as load_bytes

    from .numpy_gpt2 import NumpyGPT2

    if not path.is_file():
        raise TLMUnavailable(f"no TLM weights for {target} ({path.name} is not installed)")
    data = path.read_bytes()
    with safe_open(str(path), "np") as f:
        meta = f.metadata() or {}
    if meta.get("format") != "tlmpack-tlm" or meta.get("vocab_sha256") != VOCAB_SHA256:
        raise TLMUnavailable(f"{path.name} was trained on another vocabulary than language v{LANGUAGE_VERSION}")
    shape = ModelShape(**json.loads(meta["shape"]))
    summary = TrainingSummary.from_json(json.loads(meta["summary"]))
    state = load_bytes(data)
    net = NumpyGPT2(state, shape.n_layer, shape.n_head, shape.n_positions)
    return LoadedTLM(net, state, target, hashlib.sha256(data).hexdigest(), summary, shape)


@functools.lru_cache(maxsize=4)
def load(target: str, path: str | None = None) -> LoadedTLM:
    """The shipped model of ``target`` (or the weights at ``path``), loaded once per process."""
    if target not in TARGETS:
        raise TLMUnavailable(f"no TLM for target {target}")
    return load_file(Path(path) if path else weights_path(target), target)


def set_min_confidence(path: Path, value: float) -> str:
    """Rewrites a weights file's confidence floor (the same tensors, new metadata); returns the
    new sha256 (the model id changes with it: a build that used another floor chose differently)."""
    return set_summary_fields(path, min_confidence=float(value))


def set_summary_fields(path: Path, **fields: Any) -> str:
    """Rewrites fields of a weights file's training summary (the same tensors); returns the new sha256."""
    from safetensors import safe_open
    from safetensors.numpy import load as load_bytes
    from safetensors.numpy import save_file

    with safe_open(str(path), "np") as f:
        meta = dict(f.metadata() or {})
    summary = json.loads(meta["summary"]) | fields
    TrainingSummary.from_json(summary)  # refuses a field the summary does not have
    meta["summary"] = json.dumps(summary, sort_keys=True)
    state = load_bytes(path.read_bytes())
    tmp = path.with_suffix(".tmp")
    save_file(dict(sorted(state.items())), str(tmp), metadata=meta)
    tmp.replace(path)
    load.cache_clear()
    return hashlib.sha256(path.read_bytes()).hexdigest()
