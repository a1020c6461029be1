"""The record store under data/: append-only, gzip-compressed, plain JSON (schema in data/README.md).

    data/tasks/<task>.json.gz           one task's unscheduled PrimFunc (TVMScript) and description
    data/corpus/<model>.json            the tasks of one corpus model (key, name, calls)
    data/records/<target>/<run>.jsonl.gz  measured records, one JSON object per line
    data/exhausted/<target>.jsonl       tasks whose space a collect run found (nearly) all measured

Each collect run writes its own shard, one gzip member per flushed batch, so a run stopped at any
moment loses at most the batch in flight, and a torn last member is skipped when reading.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

RECORD_VERSION = 1
QUIET_SLACK = 0.2  # cores of other work tolerated beyond those the measurement left free


# x86 records' ``sketch_order`` (training/sketch_order.py): "llvm", DesignSpace's order on every ISA
# since 2026-12-08; "target" (or absent, before then), the order MetaSchedule's rules for the record's
# CPU gave, which data/sketch-order/x86.json maps to today's where it differed
SKETCH_ORDER = "llvm"
LEGACY_SKETCH_ORDER = "target"

WEIGHTS_AS_BUILT = "as-built"  # records' ``weights``: the kernel read the weight packed as a build packs it


def timed_as_built(record: dict, weight_params: dict[str, int]) -> bool:
    """Whether a record's kernel read its weight as a build passes it: pre-packed (``weights:
    "as-built"``) for a task whose build packs one (Store.weight_params), plain otherwise. x86
    records of those tasks from before 2026-12-03 timed the plain weight: another kernel."""
    if record.get("target") != "x86":
        return True
    return (record.get("weights") == WEIGHTS_AS_BUILT) == (record["task"] in weight_params)


def is_quiet(record: dict) -> bool:
    """Timed while other processes left the measurement its cores: other_load at most the
    machine's cpus minus the threads used (plus a little slack)."""
    free = int(record.get("machine", {}).get("cores") or 0) - int(record.get("hardware", {}).get("cores") or 0)
    return record.get("other_load", 0.0) <= max(free, 0) + QUIET_SLACK


def sketch_order_path(root: Path) -> Path:
    return root / "sketch-order" / "x86.json"


def legacy_order_key(task: str, cpu: str, cores: int) -> str:
    return f"{task}|{cpu}|{cores}"


def _in_todays_order(record: dict, table: dict[str, list[int]]) -> dict:
    """An older x86 record with its sketch index in today's order (training/sketch_order.py)."""
    if record.get("target") != "x86" or record.get("sketch_order") == SKETCH_ORDER:
        return record
    hw = record.get("hardware", {})
    mapping = table.get(legacy_order_key(record["task"], hw.get("llvm_cpu", ""), int(hw.get("cores") or 0)))
    if mapping and 0 <= record["sketch"] < len(mapping):  # appended sketches come after and keep theirs
        record = {**record, "sketch": mapping[record["sketch"]]}
    return record


def default_root() -> Path:
    from .._paths import REPO_ROOT

    return REPO_ROOT / "data"


class Store:
    """One data/ directory."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    # ---- tasks and corpus -------------------------------------------------------------------
    def task_path(self, key: str) -> Path:
        return self.root / "tasks" / f"{key}.json.gz"

    def has_task(self, key: str) -> bool:
        return self.task_path(key).is_file()

    def put_task(self, task: dict) -> None:
        """Writes a task once (tasks are immutable: same key, same PrimFunc)."""
        path = self.task_path(task["key"])
        if path.is_file():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with gzip.GzipFile(tmp, "wb", mtime=0) as f:
            f.write(json.dumps(task, sort_keys=True).encode())
        tmp.replace(path)

    def task(self, key: str) -> dict:
        with gzip.open(self.task_path(key), "rt") as f:
            return json.load(f)

    def task_keys(self) -> list[str]:
        return sorted(p.name.removesuffix(".json.gz") for p in (self.root / "tasks").glob("*.json.gz"))

    def corpus_path(self, model: str) -> Path:
        return self.root / "corpus" / f"{model}.json"

    def put_corpus(self, model: str, entry: dict) -> None:
        path = self.corpus_path(model)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")

    def corpus(self, model: str) -> dict | None:
        path = self.corpus_path(model)
        return json.loads(path.read_text()) if path.is_file() else None

    def corpora(self) -> list[dict]:
        """Every stored corpus entry (a model and its tasks), by model name."""
        return [json.loads(p.read_text()) for p in sorted((self.root / "corpus").glob("*.json"))]

    def weight_params(self) -> dict[str, int]:
        """Task key -> the parameter a build pre-packs (a constant weight read tiled; corpus
        entries' ``weight_param``, written by onnx_corpus). The x86 timer packs it the same way."""
        found: dict[str, int] = {}
        for entry in self.corpora():
            for t in entry.get("tasks", ()):
                if t.get("weight_param") is not None:
                    found.setdefault(t["key"], int(t["weight_param"]))
        return found

    # ---- records ------------------------------------------------------------------------------
    def records(self, target: str | None = None, as_built: bool = False) -> Iterator[dict]:
        """Every record (valid or not) of ``target`` (all targets when None), shard by shard, x86
        sketch indices in today's order (sketch_order_path). ``as_built``: only those whose kernel
        was timed as builds run it (timed_as_built)."""
        base = self.root / "records"
        weight_params = self.weight_params() if as_built else {}
        table = self._sketch_orders()
        for shard in sorted(base.glob(f"{target or '*'}/*.jsonl.gz")):
            for r in self.shard(shard, table):
                if not as_built or timed_as_built(r, weight_params):
                    yield r

    def shard(self, path: str | Path, table: dict[str, list[int]] | None = None) -> Iterator[dict]:
        """One shard's records (any path, e.g. a pass's own run), x86 sketch indices in today's order."""
        table = self._sketch_orders() if table is None else table
        for r in read_shard(Path(path)):
            yield _in_todays_order(r, table)

    def _sketch_orders(self) -> dict[str, list[int]]:
        path = sketch_order_path(self.root)
        return json.loads(path.read_text()) if path.is_file() else {}

    def writer(self, target: str, run: str | None = None) -> ShardWriter:
        run = run or f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{socket.gethostname()[:16]}-{os.getpid()}"
        return ShardWriter(self.root / "records" / target / f"{run}.jsonl.gz")

    # ---- exhausted spaces -------------------------------------------------------------------------
    def exhausted_path(self, target: str) -> Path:
        return self.root / "exhausted" / f"{target}.jsonl"

    def mark_exhausted(self, target: str, key: str, cores: int, points: int) -> None:
        """Notes that sampling task ``key`` for ``cores`` cores stopped finding new points after
        ``points`` known ones, so later runs skip it instead of drawing hundreds of duplicates."""
        path = self.exhausted_path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"task": key, "cores": cores, "points": points,
                           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, sort_keys=True)
        with open(path, "a") as f:
            f.write(line + "\n")

    def exhausted(self, target: str, cores: int) -> set[str]:
        """Task keys whose space a run found exhausted on ``cores`` cores (a torn last line is skipped)."""
        path = self.exhausted_path(target)
        if not path.is_file():
            return set()
        keys = set()
        for line in path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if entry.get("cores") == cores:
                keys.add(entry["task"])
        return keys

    def stats(self) -> dict:
        """What the store holds: tasks, and valid measured records per target."""
        counts: dict[str, int] = {"x86": 0, "cuda": 0}
        invalid: dict[str, int] = {"x86": 0, "cuda": 0}
        per_task: dict[str, int] = {}
        quiet: dict[str, int] = {"x86": 0, "cuda": 0}
        timers: dict[str, int] = {}
        for r in self.records():
            target = r.get("target", "?")
            if r.get("valid"):
                counts[target] = counts.get(target, 0) + 1
                if target == "x86":
                    timer = r.get("timer", "tvm_runtime")
                    timers[timer] = timers.get(timer, 0) + 1
                if is_quiet(r):
                    quiet[target] = quiet.get(target, 0) + 1
                per_task[r["task"]] = per_task.get(r["task"], 0) + 1
            else:
                invalid[target] = invalid.get(target, 0) + 1
        return {"tasks": len(self.task_keys()), "records": counts, "invalid": invalid, "quiet": quiet,
                "x86_timer": timers,
                "tasks_with_records": len(per_task),
                "models": sorted(p.stem for p in (self.root / "corpus").glob("*.json"))}


def read_shard(path: Path) -> Iterator[dict]:
    """Records of one shard; stops quietly at a torn last gzip member (a run killed mid-write)."""
    data = path.read_bytes()
    while data:
        d = zlib.decompressobj(wbits=31)
        try:
            chunk = d.decompress(data)
        except zlib.error:
            return
        if not d.eof:
            return
        for line in chunk.decode().splitlines():
            if line.strip():
                yield json.loads(line)
        data = d.unused_data


class ShardWriter:
    """Appends batches of records to one shard, each batch a complete gzip member, flushed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.written = 0

    def append(self, records: list[dict]) -> None:
        if not records:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        records = [{"sketch_order": SKETCH_ORDER, **r} if r.get("target") == "x86" else r for r in records]
        payload = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records).encode()
        member = gzip.compress(payload, compresslevel=9, mtime=0)
        with open(self.path, "ab") as f:
            f.write(member)
            f.flush()
            os.fsync(f.fileno())
        self.written += len(records)
