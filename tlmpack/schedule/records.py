"""The schedule of one task as plain data: the sketch, the decisions in trace order, who chose them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    """One sampling instruction's value. ``kind``: tile | categorical | compute_location."""

    kind: str
    value: tuple[int, ...] | int

    def to_json(self) -> list:
        return [self.kind, list(self.value) if isinstance(self.value, tuple) else self.value]

    @staticmethod
    def from_json(d: list) -> Decision:
        kind, value = d
        return Decision(kind, tuple(value) if isinstance(value, list) else int(value))


@dataclass(frozen=True)
class ScheduleRecord:
    """What the manifest says about one subgraph's schedule on one target."""

    task: str
    target: str  # "x86" | "cuda"
    sketch: int  # index into the design space's sketches; -1 when no sketch was used
    decisions: tuple[Decision, ...]
    chosen_by: str  # default | heuristic | tlm | search | dlight | unscheduled
    note: str = ""

    def to_json(self) -> dict:
        return {"task": self.task, "target": self.target, "sketch": self.sketch,
                "decisions": [d.to_json() for d in self.decisions], "chosen_by": self.chosen_by,
                "note": self.note}

    @staticmethod
    def from_json(d: dict) -> ScheduleRecord:
        return ScheduleRecord(d["task"], d["target"], int(d["sketch"]),
                              tuple(Decision.from_json(x) for x in d["decisions"]), d["chosen_by"], d.get("note", ""))
