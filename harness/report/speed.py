"""GPU-over-CPU speedups from records: the same spec, profile, data size and framework
(the array-module code: NumPy on the CPU, CuPy on the GPU) on the same host, CPU time
over GPU time, with and without the host-to-device transfer.

Compile and warm-up time is excluded from both sides (each record keeps it apart). A TF32
GPU run is set against the strict CPU run of its framework. Where one side has no record,
the row keeps the other and says so, rather than vanishing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from harness.core.registry import FLOAT64, ORACLE, STRICT, Cell, code_name
from harness.records.schema import Record


@dataclass(frozen=True)
class SpeedRow:
    cell: Cell
    cpu: Record | None
    gpu: Record | None

    @staticmethod
    def _ok(record: Record | None) -> bool:
        return record is not None and record.status == "ok" and record.timings is not None

    @property
    def speedup(self) -> float | None:
        """CPU training time per step over GPU training time per step."""
        if not (self._ok(self.cpu) and self._ok(self.gpu)):
            return None
        return self.cpu.timings.per_step_s / self.gpu.timings.per_step_s

    @property
    def speedup_with_transfers(self) -> float | None:
        """The same, with each side's transfer of the data (and model) to its device added."""
        if not (self._ok(self.cpu) and self._ok(self.gpu)):
            return None
        cpu, gpu = self.cpu.timings, self.gpu.timings
        return (cpu.transfer_s + cpu.train_s) / (gpu.transfer_s + gpu.train_s)


def _cell(record: Record, precision: str) -> Cell:
    """A speed row's cell: the code a framework runs, on both devices (device left empty),
    with the GPU side's precision; both sides run in the same mode."""
    return Cell(
        record.spec.name,
        record.spec.profile,
        n_train=record.data.n_train,
        framework=code_name(record.framework),
        precision=precision,
        mode=record.mode,
        host=record.host.label,
    )


def speed_rows(records: Iterable[Record]) -> list[SpeedRow]:
    """One row per (spec, profile, size, framework, GPU precision, host, mode); the newest
    record of each side wins. The oracle is not a speed contestant, nor is a float64 twin
    (its first steps in float64 serve math parity)."""
    cpu: dict[Cell, Record] = {}
    gpu: dict[Cell, Record] = {}
    for record in sorted(records, key=lambda r: r.created):
        if record.framework == ORACLE or record.precision_mode == FLOAT64:
            continue
        if record.device.kind == "gpu":
            gpu[_cell(record, record.precision_mode)] = record
        elif record.precision_mode == STRICT:
            cpu[_cell(record, STRICT)] = record
    cells = set(cpu) | set(gpu)
    # A CPU run also stands against the TF32 GPU run of its framework.
    for cell in list(gpu):
        if cell.precision != STRICT:
            twin = replace(cell, precision=STRICT)
            if twin in cpu:
                cpu[cell] = cpu[twin]
    rows = [SpeedRow(cell, cpu.get(cell), gpu.get(cell)) for cell in cells]
    return sorted(rows, key=lambda r: (r.cell.spec, r.cell.profile, r.cell.n_train, r.cell.framework, r.cell.mode, r.cell.precision, r.cell.host))
