#!/usr/bin/env python
"""Where does torch on the GPU part ways with torch on the CPU? Runs a zoo model on both with
forward hooks and prints the first modules whose outputs differ by more than --tolerance.

    python bench/torch_cpu_gpu_diff.py efficientnet-b0 [--tolerance 1e-5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def capture(module, args):
    import torch

    outputs, hooks = {}, []

    def keeper(name: str):
        def keep(_module, _inputs, output) -> None:  # returns None: the output stays as it is
            if isinstance(output, torch.Tensor) and name not in outputs:
                outputs[name] = output.detach().double().cpu().numpy()

        return keep

    for name, sub in module.named_modules():
        hooks.append(sub.register_forward_hook(keeper(name)))
    with torch.no_grad():
        module(*args)
    for h in hooks:
        h.remove()
    return outputs


def main() -> int:
    import torch

    from tlmpack import zoo

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tolerance", type=float, default=1e-5)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    module, example, _, _ = zoo.get_model(args.model, 0, "portable")
    cpu = capture(module, example)
    gpu = capture(module.cuda(), [e.cuda() for e in example])
    shown = 0
    for name, ref in cpu.items():
        got = gpu[name]
        err = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
        if err > args.tolerance:
            print(f"{name or '(model)'}: {type(module.get_submodule(name)).__name__} {tuple(ref.shape)} rel diff {err:.2e}")
            shown += 1
            if shown >= 12:
                break
    print("no module differs" if not shown else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
