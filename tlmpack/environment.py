"""Environment variables set for the length of a block, then put back as they were.

One home for it: a build's switches (build_switches.py) and the bench scripts that load one
artifact under two runtime settings both need it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


@contextlib.contextmanager
def environment(settings: Mapping[str, str]) -> Iterator[None]:
    """Sets ``settings`` in os.environ inside the block; restores (or removes) each on the way out."""
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
