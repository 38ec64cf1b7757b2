"""Progress of a long run: a live bar on a terminal, a line every print_every steps in a log."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

LOG_WIDTH = 160  # a log file has no terminal width: keep the table and the lines whole


def console() -> Console:
    plain = Console()
    return plain if plain.is_terminal else Console(width=LOG_WIDTH)


# In a log, a line at least this often (seconds), whatever print_every says.
LOG_SECONDS = 10.0


def printer(out: Console, label: str, total: int, every: int):
    """Progress of one run, called at the end of each chunk of steps: a live bar on a
    terminal; in a log, a line every `every` steps, and at least every LOG_SECONDS."""
    if out.is_terminal:
        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("step loss {task.fields[loss]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=out,
            transient=True,
        )
        task = bar.add_task(label, total=total, loss="-")
        bar.start()

        def update(step: int, loss: float | None) -> None:
            bar.update(task, completed=step, loss=f"{loss:.6g}")
            if step >= total:
                bar.stop()

        return update

    last = time.monotonic()

    def log(step: int, loss: float | None) -> None:
        nonlocal last
        if step % every == 0 or step >= total or time.monotonic() - last >= LOG_SECONDS:
            last = time.monotonic()
            out.print(f"  {label} step {step}/{total} step loss {loss:.7g}", highlight=False)

    return log
