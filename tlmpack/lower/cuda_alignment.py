"""Asynchronous copies (``cp.async``) in lowered CUDA device code whose offsets are not provably a
multiple of their width: the point is refused before it is compiled, since on the GPU it faults.

InjectPTXAsyncCopy turns a pipelined cooperative fetch that TVM vectorised into 8- or 16-byte
``cp.async`` copies, without checking that each copy starts aligned: a convolution point of
MetaSchedule's second CUDA sketch copied weights 2 floats at a time from ``... + rc + 1``, with
``rc`` the reduction loop, and every run died with ``CUDA error: misaligned address`` (all 6 such
programs of the 2026-12-01 H200 batch are caught here; none of its 124 valid programs is).
VerifyGPUCode does not look at alignment. Plain vector loads and stores need no check: TVM's CUDA
codegen already reads one it cannot prove aligned element by element (``make_float2(a[i], a[i+1])``).
Buffers themselves are aligned (the plan's arena and workspaces start on 256-byte boundaries,
shared arrays on 64), so a copy is safe when both its offsets, in elements, are multiples of its
lane count for every value of the loops and threads, which TVM's arithmetic analyzer proves from
the offsets' modular sets (let-bound names bound to their values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CP_ASYNC = "tirx.s_tir.cp_async_raw"  # what InjectPTXAsyncCopy writes (TVM 0.27)


@dataclass(frozen=True)
class Misaligned:
    """One vector access that may start off its natural alignment."""

    kernel: str
    what: str  # "8-byte cp.async (global side)"
    offset: str  # the offset expression, in elements
    lanes: int

    def sentence(self) -> str:
        return (f"{self.kernel}: {self.what} at element offset {self.offset}, not provably a multiple of "
                f"{self.lanes} (a misaligned vector access faults on the GPU)")


def misaligned_accesses(device_mod) -> list[Misaligned]:
    """Every cp.async of ``device_mod``'s kernels (after TVM's TIR pipeline, before codegen) whose
    offsets the analyzer cannot prove aligned."""
    found: list[Misaligned] = []
    for gvar, func in device_mod.functions.items():
        walker = _Walker(gvar.name_hint)
        walker.stmt(func.body)
        found += walker.found
    return found


class _Walker:
    """The statements of one kernel: InjectPTXAsyncCopy writes each copy as a statement of its own
    (``Evaluate`` of the call), and the offsets' common parts as let-bound names before it."""

    def __init__(self, kernel: str) -> None:
        from tvm.sym.analyzer import Analyzer

        self.kernel = kernel
        self.found: list[Misaligned] = []
        self.bound: set[Any] = set()
        self.analyzer = Analyzer()

    def stmt(self, s) -> None:
        import tvm
        from tvm import tirx

        if s is None:
            return
        if isinstance(s, tirx.SeqStmt):
            for x in s.seq:
                self.stmt(x)
            return
        if isinstance(s, (tirx.LetStmt, tirx.Bind)) and s.var not in self.bound:
            self.bound.add(s.var)  # SSA: bound once, in program order
            self.analyzer.bind(s.var, s.value)
        elif isinstance(s, tirx.IfThenElse):
            self.stmt(s.then_case)
            self.stmt(s.else_case)
        elif isinstance(s, tirx.Evaluate) and isinstance(s.value, tvm.ir.expr.Call) \
                and getattr(s.value.op, "name", "") == CP_ASYNC:
            self.cp_async(s.value)
        self.stmt(getattr(s, "body", None))  # For, While, AttrStmt, AllocBuffer, LetStmt, ...

    def cp_async(self, call) -> None:
        from tvm import tirx

        # cp_async_raw(shared data, shared offset, global data, global offset, bytes), offsets in elements
        # of the call's dtype
        args = list(call.args)
        if len(args) != 5 or not isinstance(args[4], tirx.IntImm):
            return
        nbytes = int(args[4].value)
        lanes = nbytes // max(1, int(_dtype(call).bits) // 8)
        if lanes <= 1:
            return
        for side, offset in (("shared", args[1]), ("global", args[3])):
            m = self.analyzer.modular_set(offset)
            if m.coeff % lanes or m.base % lanes:
                self.found.append(Misaligned(self.kernel, f"{nbytes}-byte cp.async ({side} side)", str(offset), lanes))


def _dtype(expr):
    """An expression's DataType (TVM 0.27: its ``ty`` is a PrimType holding it)."""
    ty = getattr(expr, "ty", None)
    return getattr(ty, "dtype", None) or getattr(expr, "dtype", None)
