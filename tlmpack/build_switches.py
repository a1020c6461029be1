"""Switches that change generated code, as build options: resolved once, recorded, applied for the build.

The heuristics registry reads TLMPACK_DISABLE_RULES and the CUDA matmul rule TLMPACK_CUDA_PIPELINE
from the environment. A build must not depend on what it does not record, so `resolve` turns them
into BuildOptions fields (an option given explicitly wins; None means "what the environment says"),
the manifest records them with the other options, and `applied` sets exactly those values for the
duration of the build, so the rules see what the manifest says and nothing else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

from .environment import environment

DISABLE_RULES_ENV = "TLMPACK_DISABLE_RULES"
CUDA_PIPELINE_ENV = "TLMPACK_CUDA_PIPELINE"


def rules_from_env() -> tuple[str, ...]:
    return tuple(sorted({n.strip() for n in os.environ.get(DISABLE_RULES_ENV, "").split(",") if n.strip()}))


def pipeline_from_env() -> bool:
    return os.environ.get(CUDA_PIPELINE_ENV, "") not in ("", "0")


def resolve(options: Any) -> Any:
    """The options with every switch decided (None → the environment's value), rule names checked."""
    from .errors import LoweringError
    from .schedule.heuristics.registry import all_rule_names

    rules = options.disabled_rules if options.disabled_rules is not None else rules_from_env()
    known = all_rule_names()
    unknown = sorted(set(rules) - set(known))
    if unknown:
        raise LoweringError(f"--disable-rules: unknown rule {', '.join(map(repr, unknown))}; the rules are "
                            f"{', '.join(known)}")
    pipeline = options.cuda_pipeline if options.cuda_pipeline is not None else pipeline_from_env()
    return dataclasses.replace(options, disabled_rules=tuple(sorted(set(rules))), cuda_pipeline=bool(pipeline))


@contextlib.contextmanager
def applied(options: Any) -> Iterator[None]:
    """Sets the switches' environment variables to the resolved options while the build runs."""
    wanted = {DISABLE_RULES_ENV: ",".join(options.disabled_rules),
              CUDA_PIPELINE_ENV: "1" if options.cuda_pipeline else "0"}
    with environment(wanted):
        yield
