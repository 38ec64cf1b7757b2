"""The same cell on several hosts or GPU models (`--places`, `--gpu-types`, on Ray): each
framework cell runs once per place; the first place's runs are the matrix's, the others are
judged against them (harness/verdict/cross_host.py)."""

from __future__ import annotations

from dataclasses import replace

from harness.run.capacity import GPU_TYPE
from harness.run.cells import FRAMEWORK, Cell


def is_copy(cell: Cell) -> bool:
    """Whether a cell is a framework cell's run at a place after the first."""
    return cell.place is not None and cell.name.endswith(f" at {cell.place}")


def spread(cells: list[Cell], places: list[str]) -> list[Cell]:
    """Each framework cell once per place it can run at (a GPU model only for GPU cells);
    the first copy keeps the cell's name."""
    if not places:
        return cells
    found = []
    for cell in cells:
        where = [p for p in places if cell.role == FRAMEWORK and (cell.gpu or not p.startswith(GPU_TYPE))]
        if not where:
            found.append(cell)
            continue
        found += [replace(cell, place=p, name=cell.name if i == 0 else f"{cell.name} at {p}") for i, p in enumerate(where)]
    return found
