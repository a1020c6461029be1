#!/usr/bin/env python
"""Copies an artifact tar without its weights.bin (for carrying a variant whose weights another
artifact of the same graph already carries; load() checks the sha256 of the one put back).

    python bench/strip_weights.py IN.tar OUT.tar
"""

import sys
import tarfile

with tarfile.open(sys.argv[1]) as src, tarfile.open(sys.argv[2], "w", format=tarfile.USTAR_FORMAT) as dst:
    for member in src.getmembers():
        if member.name != "weights.bin":
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
