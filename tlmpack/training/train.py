"""`tlmpack tlm train`: pretrain the GPT-2 on legal sentences (the grammar), then fine-tune it on
the best measured programs of each training task (the taste), scoring every decision position
over its legal tokens only (the decoder's mask), and write the weights with their summary.

Same code on the CPU and on a GPU (``device``); seeded, so a run is reproducible from the
committed data and its seed (bit-exact on the CPU; on a GPU up to its kernels' reductions).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..schedule.space import SPACE_VERSION
from ..tlm.language import TOKEN_ID
from ..tlm.model import ModelShape, TrainingSummary, new_model, save
from .dataset import Example, TrainingSet


@dataclass(frozen=True)
class TrainConfig:
    pretrain_steps: int = 1500
    finetune_steps: int = 800
    batch: int = 64
    lr: float = 2e-3
    finetune_lr: float = 5e-4
    weight_decay: float = 0.01
    seed: int = 0
    device: str = "cpu"
    min_confidence: float = 0.0  # 0: derive from the training tasks' own decodes (see confidence_floor)
    rank_steps: int = 0  # after the taste: steps of rank_loss (plus the taste's loss) over the ranking groups
    rank_groups: int = 8  # groups a ranking step
    rank_lr: float = 2e-4


def _batch(examples: list[Example], device: str, vocab: int):
    """Padded ids, and for every scored position: (row, position, target id) and its legal mask."""
    import torch

    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), TOKEN_ID["[PAD]"], dtype=torch.long)
    rows, cols, targets, weights = [], [], [], []
    mask = []
    for i, e in enumerate(examples):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        for pos, legal in e.scored:
            rows.append(i)
            cols.append(pos - 1)  # the logits at pos-1 predict the token at pos
            targets.append(e.ids[pos])
            weights.append(e.weight)
            mask.append(legal)
    legal = torch.zeros((len(mask), vocab), dtype=torch.bool)
    for j, allowed in enumerate(mask):
        legal[j, list(allowed)] = True
    attention = (ids != TOKEN_ID["[PAD]"]).long()
    t = torch.tensor
    return (ids.to(device), attention.to(device), t(rows).to(device), t(cols).to(device), t(targets).to(device),
            t(weights, dtype=torch.float32).to(device), legal.to(device))


def masked_loss(model, batch) -> tuple:
    """Weighted cross-entropy of each scored token among its legal tokens; also the top-1 hit rate."""
    import torch

    ids, attention, rows, cols, targets, weights, legal = batch
    logits = model(input_ids=ids, attention_mask=attention).logits[rows, cols].float()
    logits = logits.masked_fill(~legal, float("-inf"))
    nll = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    loss = (nll * weights).sum() / weights.sum()
    hits = (logits.argmax(-1) == targets).float().mean()
    return loss, hits


def _next_batch(order: list[int], size: int, population: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """The next ``size`` indices of shuffled passes over ``population`` items, and what is left of
    the pass (a new shuffled pass is appended when the current one runs short)."""
    if len(order) < size:
        more = list(range(population))
        rng.shuffle(more)
        order = order + more
    return order[:size], order[size:]


def sequence_log_probs(model, batch, sequences: int):
    """Per sentence of ``batch`` (_batch's tuple): the log-probability the masked decoder gives its
    whole program, the sum over its scored positions of the recorded token's log-softmax among
    the legal tokens there."""
    import torch

    ids, attention, rows, cols, targets, _, legal = batch
    logits = model(input_ids=ids, attention_mask=attention).logits[rows, cols].float()
    logp = torch.log_softmax(logits.masked_fill(~legal, float("-inf")), dim=-1)
    picked = logp.gather(1, targets[:, None])[:, 0]
    return torch.zeros(sequences, device=picked.device).index_add(0, rows, picked)


def rank_loss(model, groups: list[tuple[tuple[Example, float], ...]], device: str, vocab: int) -> tuple:
    """Listwise loss over measured programs: within each group, the cross-entropy between the
    target weights (faster programs weigh more, dataset.rank_programs) and the softmax of the
    model's program log-probabilities over the group. Unlike the taste's loss, it also lowers the
    probability of the slow programs measured, the model's own bad picks included. Also the rate
    at which the model's likeliest program of a group is its fastest."""
    import torch

    examples = [ex for group in groups for ex, _ in group]
    scores = sequence_log_probs(model, _batch(examples, device, vocab), len(examples))
    losses, hits, start = [], 0.0, 0
    for group in groups:
        s = scores[start: start + len(group)]
        q = torch.tensor([w for _, w in group], device=s.device)
        losses.append(-(q * torch.log_softmax(s, dim=0)).sum())
        hits += float(int(s.argmax()) == int(q.argmax()))
        start += len(group)
    return torch.stack(losses).mean(), hits / len(groups)


def _rank_phase(model, data: TrainingSet, cfg: TrainConfig, rng: random.Random,
                say: Callable[[str], None]) -> dict:
    """The ranking steps: rank_loss over ``cfg.rank_groups`` groups plus the taste's loss on a
    taste batch (so the model stays a good generator of the fast programs while it learns to
    order them)."""
    import torch

    if not data.ranking or cfg.rank_steps <= 0:
        return {"steps": 0}
    steps = cfg.rank_steps
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.rank_lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    vocab = model.config.vocab_size
    group_order: list[int] = []
    taste_order: list[int] = []
    started = time.perf_counter()
    loss_avg = hits_avg = 0.0
    model.train()
    for step in range(steps):
        picked, group_order = _next_batch(group_order, cfg.rank_groups, len(data.ranking), rng)
        loss, hits = rank_loss(model, [data.ranking[i] for i in picked], cfg.device, vocab)
        if data.taste:
            chosen, taste_order = _next_batch(taste_order, cfg.batch, len(data.taste), rng)
            loss = loss + masked_loss(model, _batch([data.taste[i] for i in chosen], cfg.device, vocab))[0]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_avg = 0.98 * loss_avg + 0.02 * float(loss.detach()) if step else float(loss.detach())
        hits_avg = 0.98 * hits_avg + 0.02 * hits if step else hits
        if (step + 1) % max(1, steps // 10) == 0 or step + 1 == steps:
            say(f"rank {step + 1}/{steps}: loss {loss_avg:.3f}, fastest ranked first {hits_avg:.3f} "
                f"({time.perf_counter() - started:.0f} s)")
    model.eval()
    return {"steps": steps, "groups": len(data.ranking), "loss": round(loss_avg, 4), "top1": round(hits_avg, 4),
            "seconds": round(time.perf_counter() - started, 1)}


def rank_eval(model, groups: list[tuple[tuple[Example, float], ...]], device: str, chunk: int = 16) -> dict:
    """The mean ranking loss over ``groups`` and how often the model's likeliest program of a group
    is its fastest, no gradients."""
    import torch

    if not groups:
        return {}
    hits, n, loss = 0.0, 0, 0.0
    with torch.no_grad():
        for i in range(0, len(groups), chunk):
            part = groups[i: i + chunk]
            value, hit = rank_loss(model, part, device, model.config.vocab_size)
            loss += float(value) * len(part)
            hits += hit * len(part)
            n += len(part)
    return {"groups": n, "loss": round(loss / n, 4), "fastest_first": round(hits / n, 4)}


def _phase(model, examples: list[Example], steps: int, lr: float, cfg: TrainConfig, rng: random.Random,
           name: str, say: Callable[[str], None]) -> dict:
    import torch

    if not examples or steps <= 0:
        return {"steps": 0}
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    vocab = model.config.vocab_size
    order: list[int] = []
    started = time.perf_counter()
    loss_avg = hits_avg = 0.0
    model.train()
    for step in range(steps):
        picked, order = _next_batch(order, cfg.batch, len(examples), rng)
        loss, hits = masked_loss(model, _batch([examples[i] for i in picked], cfg.device, vocab))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_value, hits_value = float(loss.detach()), float(hits)
        loss_avg = 0.98 * loss_avg + 0.02 * loss_value if step else loss_value
        hits_avg = 0.98 * hits_avg + 0.02 * hits_value if step else hits_value
        if (step + 1) % max(1, steps // 10) == 0 or step + 1 == steps:
            say(f"{name} {step + 1}/{steps}: loss {loss_avg:.3f}, top-1 {hits_avg:.3f} "
                f"({time.perf_counter() - started:.0f} s)")
    model.eval()
    return {"steps": steps, "loss": round(loss_avg, 4), "top1": round(hits_avg, 4),
            "seconds": round(time.perf_counter() - started, 1)}


def evaluate(model, examples: list[Example], device: str, batch: int = 128) -> dict:
    """Masked loss and top-1 over ``examples`` (unweighted), no gradients."""
    import torch

    if not examples:
        return {}
    losses, hits, n = 0.0, 0.0, 0
    with torch.no_grad():
        for i in range(0, len(examples), batch):
            chunk = [Example(e.ids, e.scored, 1.0) for e in examples[i: i + batch]]
            loss, hit = masked_loss(model, _batch(chunk, device, model.config.vocab_size))
            losses += float(loss) * len(chunk)
            hits += float(hit) * len(chunk)
            n += len(chunk)
    return {"loss": round(losses / n, 4), "top1": round(hits / n, 4)}


DEFAULT_CONFIG, DEFAULT_SHAPE = TrainConfig(), ModelShape()
GUIDED_SHAPE = ModelShape(n_positions=256)  # a guided sentence holds two schedules


def train(data: TrainingSet, target: str, out: Path, cfg: TrainConfig = DEFAULT_CONFIG,
          shape: ModelShape = DEFAULT_SHAPE, say: Callable[[str], None] = print, init: Path | None = None,
          heldout: TrainingSet | None = None) -> dict:
    """Both phases (only the taste when ``init`` gives pretrained weights), then saves ``out``."""
    import torch

    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    if cfg.device == "cpu":
        torch.use_deterministic_algorithms(True)
    rng = random.Random(cfg.seed)
    base = None
    if init is not None:
        from ..tlm.model import load_file

        base = load_file(init, target)
        model, shape = base.torch_model(), base.shape
    else:
        model = new_model(shape, cfg.seed)
    longest = max((len(e.ids) for e in data.grammar + data.taste), default=0)
    if longest > shape.n_positions:
        raise ValueError(f"the longest training sentence has {longest} tokens, over the model's {shape.n_positions} "
                         "positions (a guided set needs GUIDED_SHAPE)")
    if base is not None and base.summary.guided != data.guided:
        raise ValueError(f"--init weights are {'' if base.summary.guided else 'not '}guided, the training set is "
                         f"{'' if data.guided else 'not '}: fine-tune on the same kind of sentences")
    model.to(cfg.device)
    say(f"{target}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters; "
        f"{len(data.grammar)} grammar and {len(data.taste)} taste sentences over {len(data.tasks)} tasks")
    report = {"target": target, "seed": cfg.seed, "device": cfg.device}
    if init is None:
        report["pretrain"] = _phase(model, data.grammar, cfg.pretrain_steps, cfg.lr, cfg, rng, "pretrain", say)
    report["finetune"] = _phase(model, data.taste, cfg.finetune_steps, cfg.finetune_lr, cfg, rng, "finetune", say)
    report["rank"] = _rank_phase(model, data, cfg, rng, say)
    model.to("cpu")
    report["taste_eval"] = evaluate(model, data.taste, "cpu")
    if heldout is not None:
        report["heldout_taste_eval"] = evaluate(model, heldout.taste, "cpu")
        report["heldout_grammar_eval"] = evaluate(model, heldout.grammar, "cpu")
        report["heldout_rank_eval"] = rank_eval(model, heldout.ranking, "cpu")
        say(f"held-out tasks: taste {report['heldout_taste_eval']}, grammar {report['heldout_grammar_eval']}, "
            f"ranking {report['heldout_rank_eval']}")
    # what the model has seen: this run's tasks, and those of the weights it started from
    kinds = sorted({data.infos[k].kind for k in data.tasks} | set(base.summary.kinds if base else ()))
    ops = sorted({w for k in data.tasks for w in data.infos[k].ops} | set(base.summary.ops if base else ()))
    ranges: dict[str, list[int]] = {k: list(v) for k, v in (base.summary.extent_range if base else {}).items()}
    for k in data.tasks:
        info = data.infos[k]
        size = math.prod(info.spatial or (1,)) * math.prod(info.reduction or (1,))
        low, high = ranges.get(info.kind, [size, size])
        ranges[info.kind] = [min(low, size), max(high, size)]
    summary = TrainingSummary(target, tuple(kinds), tuple(ops), dict(sorted(ranges.items())), cfg.min_confidence,
                              max(len(data.tasks), base.summary.tasks if base else 0),
                              len(data.grammar) + len(data.taste), cfg.seed, data.sha256, SPACE_VERSION, data.guided,
                              vector_bits=tuple(sorted(set(data.vector_bits) | set(base.summary.vector_bits if base else ()))),
                              channels_last=data.channels_last_convs > 0 or bool(base and base.summary.channels_last))
    report["channels_last_convs"] = data.channels_last_convs
    report["sha256"] = save(model, out, shape, summary)
    report["weights"] = str(out)
    return report


def required_hints(store, target: str) -> dict:
    """The store's hints of ``target`` for a guided set; ValueError when they were never computed."""
    from .hints import hints_path, load_hints

    hints = load_hints(store, target)
    if not hints:
        raise ValueError(f"no hints at {hints_path(store, target)}: run `tlmpack tlm hints --target {target}` first")
    return hints


def required_teacher(store, target: str) -> dict:
    """The store's teacher points of ``target``; ValueError when none were written."""
    from .hints import load_teacher, teacher_path

    teacher = load_teacher(store, target)
    if not teacher:
        raise ValueError(f"no teacher points at {teacher_path(store, target)}: run `tlmpack tlm teacher --target "
                         f"{target}` first")
    return teacher


def main(argv: list[str] | None = None) -> None:
    """``python -m tlmpack.training.train --data SET --target T --out FILE``: a training run from a
    saved training set (dataset.save_training_set), for machines without the store or click."""
    import argparse
    import json

    from .dataset import load_training_set

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--data", help="A saved training set (dataset.save_training_set).")
    p.add_argument("--store", help="Or build the set from this record store (data/), e.g. on the GPU machine.")
    p.add_argument("--llvm-cpu", default=None, help="--store: only records measured on this CPU (adapting).")
    p.add_argument("--best-k", type=int, default=8)
    p.add_argument("--rank-k", type=int, default=24, help="--store: programs per group in the ranking lists.")
    p.add_argument("--rank-steps", type=int, default=TrainConfig.rank_steps,
                   help="Ranking steps after the taste (train.rank_loss); 0: none.")
    p.add_argument("--rank-groups", type=int, default=TrainConfig.rank_groups, help="Groups a ranking step.")
    p.add_argument("--rank-timing", default="interleaved",
                   help="--store: rank only groups timed this way ('any': all; CUDA records name no timing).")
    p.add_argument("--target", required=True, choices=["x86", "cuda"])
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pretrain-steps", type=int, default=TrainConfig.pretrain_steps)
    p.add_argument("--finetune-steps", type=int, default=TrainConfig.finetune_steps)
    p.add_argument("--batch", type=int, default=TrainConfig.batch)
    p.add_argument("--device", default="cpu")
    p.add_argument("--init", default=None)
    p.add_argument("--heldout", default=None, help="A saved training set of the held-out tasks, to report on.")
    p.add_argument("--layers", type=int, default=ModelShape.n_layer)
    p.add_argument("--embd", type=int, default=ModelShape.n_embd)
    p.add_argument("--guided", action="store_true", help="--store: sentences after the rules' hints (data/hints/).")
    p.add_argument("--teacher-weight", type=float, default=0.0,
                   help="--store: also the teacher file's rules' points of unmeasured tasks, each weighing this "
                        "(0: none; `tlmpack tlm teacher` writes the file).")
    a = p.parse_args(argv)
    cfg = TrainConfig(pretrain_steps=a.pretrain_steps, finetune_steps=a.finetune_steps, batch=a.batch, seed=a.seed,
                      device=a.device, rank_steps=a.rank_steps, rank_groups=a.rank_groups)
    if a.store:
        from .dataset import build_training_set
        from .sites import load_sites
        from .store import Store

        store = Store(a.store)
        data = build_training_set(store, a.target, load_sites(store, a.target), seed=a.seed, best_k=a.best_k,
                                  llvm_cpu=a.llvm_cpu, hints=required_hints(store, a.target) if a.guided else None,
                                  rank_k=a.rank_k if a.rank_steps > 0 else 0,
                                  rank_timing=None if a.rank_timing == "any" or a.target == "cuda" else a.rank_timing,
                                  teacher=required_teacher(store, a.target) if a.teacher_weight > 0 else None,
                                  teacher_weight=a.teacher_weight)
    elif a.data:
        data = load_training_set(Path(a.data))
    else:
        p.error("give --data or --store")
    positions = GUIDED_SHAPE.n_positions if data.guided else ModelShape.n_positions
    shape = ModelShape(n_layer=a.layers, n_embd=a.embd, n_positions=positions)
    report = train(data, a.target, Path(a.out), cfg, shape,
                   say=lambda m: print(m, flush=True), init=Path(a.init) if a.init else None,
                   heldout=load_training_set(Path(a.heldout)) if a.heldout else None)
    print(json.dumps(report, sort_keys=True))


if __name__ == "__main__":
    main()
