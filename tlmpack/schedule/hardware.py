"""What the schedule rules know about a target: a plain record, detected on the build host or
named for cross builds. The heuristics derive tiles, threads and vector widths from it alone."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class X86Hardware:
    cores: int
    vector_bits: int  # 256 with AVX2, 512 with AVX-512
    vector_registers: int  # 16 ymm (AVX2) or 32 zmm (AVX-512)
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int

    def lanes(self, dtype_bits: int = 32) -> int:
        return self.vector_bits // dtype_bits

    def to_json(self) -> dict:
        return {"kind": "x86", **asdict(self)}


@dataclass(frozen=True)
class CudaHardware:
    arch: str  # sm_90
    sm_count: int
    max_shared_memory_per_block: int  # without opt-in
    shared_memory_per_sm: int
    registers_per_block: int
    registers_per_sm: int
    max_threads_per_block: int
    warp_size: int = 32

    def to_json(self) -> dict:
        return {"kind": "cuda", **asdict(self)}


# Datasheet numbers per arch (the largest part of each family; --cuda-arch picks one).
CUDA_ARCHS: dict[str, CudaHardware] = {
    "sm_70": CudaHardware("sm_70", 80, 48 * 1024, 96 * 1024, 65536, 65536, 1024),  # V100
    "sm_75": CudaHardware("sm_75", 40, 48 * 1024, 64 * 1024, 65536, 65536, 1024),  # T4
    "sm_80": CudaHardware("sm_80", 108, 48 * 1024, 164 * 1024, 65536, 65536, 1024),  # A100
    "sm_86": CudaHardware("sm_86", 84, 48 * 1024, 100 * 1024, 65536, 65536, 1024),  # RTX 3090 / A40
    "sm_89": CudaHardware("sm_89", 128, 48 * 1024, 100 * 1024, 65536, 65536, 1024),  # RTX 4090 / L40
    "sm_90": CudaHardware("sm_90", 132, 48 * 1024, 228 * 1024, 65536, 65536, 1024),  # H100 / H200 SXM
}


def cuda_hardware(arch: str) -> CudaHardware:
    try:
        return CUDA_ARCHS[arch]
    except KeyError:
        raise ValueError(f"no hardware description for {arch}; known: {', '.join(CUDA_ARCHS)}") from None


def _cache_bytes(level: int, kind: str, default: int) -> int:
    """Reads /sys's cache description of cpu0; ``default`` where it is missing (containers)."""
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(root.glob("index*")):
        try:
            if int((index / "level").read_text()) == level and (index / "type").read_text().strip() in kind:
                size = (index / "size").read_text().strip()
                scale = {"K": 1024, "M": 1024 * 1024}.get(size[-1], 1)
                return int(size.rstrip("KM")) * scale
        except (OSError, ValueError):
            continue
    return default


# Caches (KiB: L1d and L2 per core, L3 of the part) of a typical part of each LLVM CPU name, for
# cross builds given no --cache: hints for tiling, not a datasheet of every SKU.
NAMED_CPU_CACHES_KIB: dict[str, tuple[int, int, int]] = {
    "haswell": (32, 256, 8192), "broadwell": (32, 256, 8192), "skylake": (32, 256, 8192),
    "skylake-avx512": (32, 1024, 25344), "cascadelake": (32, 1024, 36608), "icelake-server": (48, 1280, 49152),
    "sapphirerapids": (48, 2048, 107520), "znver2": (32, 512, 32768), "znver3": (32, 512, 32768),
    "znver4": (32, 1024, 32768),
}


def host_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def host_caches_kib() -> tuple[int, int, int]:
    return (_cache_bytes(1, "Data", 32 * 1024) // 1024, _cache_bytes(2, "Unified", 1024 * 1024) // 1024,
            _cache_bytes(3, "Unified", 8 * 1024 * 1024) // 1024)


def detect_x86(features: tuple[str, ...], cores: int | None = None,
               caches_kib: tuple[int, int, int] | None = None) -> X86Hardware:
    """The target's description: the vector ISA of its features, ``cores`` and ``caches_kib``
    (L1d, L2, L3) as given, else the build host's."""
    wide = "avx512f" in features
    l1d, l2, l3 = caches_kib or host_caches_kib()
    return X86Hardware(
        cores=cores or host_cores(),
        vector_bits=512 if wide else 256 if "avx" in features or "avx2" in features else 128,
        vector_registers=32 if wide else 16,
        l1d_bytes=l1d * 1024, l2_bytes=l2 * 1024, l3_bytes=l3 * 1024,
    )
