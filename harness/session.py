"""A run of the matrix, as `harness run` and the Python API (harness/api.py) drive it: the
options checked before any work, what runs besides the frameworks said, the devices' rates,
the executor, and every spec's matrix run (harness/matrix.py). Nothing here parses a
command line or prints a verdict."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from harness.core.errors import DataError, HarnessError
from harness.core.registry import (
    BF16,
    CALIBRATION_KEY,
    GPU_CALIBRATION_KEY,
    GPU_ORACLE_KEY,
    ONLY_ON,
    ORACLE_KEY,
    PORT_REFERENCE_KEY,
    STRICT,
    runs_on,
)
from harness.options import RunOptions
from harness.records import write
from harness.spec import load as spec_load


def spec_paths(names: list[str], specs_dir: Path) -> list[Path]:
    if names:
        return [spec_load.resolve_spec(n, specs_dir) for n in names]
    paths = list(spec_load.spec_paths(specs_dir).values())
    if not paths:
        raise HarnessError(f"{specs_dir}: no spec files (*.yaml)")
    return paths


def prepare(options: RunOptions, names: list[str]) -> tuple[Path | None, list]:
    """Checks shared by run, bench and sweep, before anything runs: repeats, the results
    folder and each spec's folder in it (`names`), the GPU when it is required; then the
    matrix's keys."""
    from harness.execute import executors, plan, probe

    if options.executor == executors.LOCAL and not options.in_process:
        executors.local_slots(options.jobs, options.threads)  # jobs and threads within the cores, said before any work
    for framework in options.frameworks or ():  # by name: of all (the default), each runs where it can
        if not any(runs_on(framework, device) for device in options.devices):
            only = ONLY_ON[framework][0]
            raise HarnessError(
                f"--frameworks {framework}: {framework} runs on the {only} only (numpy and cupy are the same "
                f"array-module code on the CPU and the GPU); add {only} to --devices"
            )
    results_dir = options.results
    if results_dir is not None:
        write.ensure_writable(results_dir)
        for name in dict.fromkeys(names):
            write.ensure_writable(results_dir / name, f"folder of {name}'s records")
    if options.work_dir is not None:  # else every job would run, and none be kept
        write.ensure_writable(options.work_dir, "work folder")
    if options.require_gpu and "gpu" not in options.devices:
        raise HarnessError("--require-gpu: add gpu to --devices")
    if options.require_gpu or list(options.devices) == ["gpu"]:  # nothing asked for would run without one
        probe.require_gpu(options.running)
    if options.references == "gpu":  # every check is judged against the oracle there
        try:
            probe.require_gpu([GPU_CALIBRATION_KEY.framework])
        except HarnessError as exc:
            raise HarnessError(f"--references gpu: the oracle runs through CuPy: {exc}") from None
    keys = plan.matrix_keys(
        options.running, list(options.devices), tf32=options.tf32, modes=options.modes, references=options.references, precisions=options.precisions
    )
    return results_dir, keys


def executor_kind(options: RunOptions) -> str:
    """The executor the options name: in-process, local, ray or ray:ADDRESS."""
    from harness.execute.capacity import INLINE

    return INLINE if options.in_process else options.executor


def make_executor(options: RunOptions):
    """The executor the options name (harness/execute/executors.py); where they write no
    records, in the processes held across calls if any are (fresh.held_processes: a record
    times its runs in fresh processes)."""
    from harness.execute import executors, fresh

    held = fresh.held() if options.results is None else None
    gpu_types, places = (list(names) if names else None for names in (options.gpu_types, options.places))
    adapters = tuple(options.running) if "cpu" in options.devices else ()
    return executors.make(executor_kind(options), options.jobs, options.threads, gpu_types, places, held, adapters)


def also_runs(frameworks: list[str], keys: list, console: Console, ports: list[str] = (), layers: bool = True, records: bool = True) -> None:
    """What runs besides the frameworks asked for, said before it runs: every verdict is
    judged against these (docs/verdict.md, "The verdict rule"). A port (`ports`, their names)
    runs torch and JAX only, against torch's float64 run (docs/ports.md)."""
    kept = "recorded" if records else "not recorded: --no-records"
    if ports:
        console.print(
            f"{', '.join(ports)}: a port, run in torch and JAX only, judged against {PORT_REFERENCE_KEY.label} (torch's float64 run, "
            f"{kept}) with torch's runs with each batch's examples permuted as members",
            highlight=False,
            soft_wrap=True,
        )
    if not layers:  # ports alone: no array-module code runs
        return
    oracle, member = (ORACLE_KEY, CALIBRATION_KEY) if ORACLE_KEY in keys else (GPU_ORACLE_KEY, GPU_CALIBRATION_KEY)
    also = [] if member.framework in frameworks else [f"{member.label} (the float32 calibration run, {kept})"]
    also += [
        f"{oracle.label} (the float64 reference, {kept})",
        "the calibration members (~orderN, shown in the table, not recorded)",
        f"a float64 twin of each framework and device (+float64, its first steps, {kept})",
    ]
    running = [f for f in frameworks if any(k.framework == f for k in keys)]  # not cupy on a CPU-only run
    console.print(f"besides {', '.join(running)}, this runs {'; '.join(also)}", highlight=False, soft_wrap=True)


def measure_rates(options: RunOptions, keys: list, console: Console) -> dict:
    """Each device's rates (per precision on the GPU), measured once, after every input was
    found good and before any run; a device that cannot be measured is said so, and its
    records carry no floor."""
    from harness.hardware.rates import describe, measure

    rates = {}
    if options.no_floor:
        return rates
    for device, precision in sorted({(k.device, k.precision) for k in keys}):
        if precision == BF16:  # the rates are float32 products': a bf16 step has no floor yet
            console.print(f"floor: {device}+{BF16} not measured (no bf16 product rate yet); its records carry no floor", highlight=False)
            continue
        try:
            rates[device, precision] = found = measure(device, precision)
        except HarnessError as exc:
            console.print(f"floor: {exc}; its records carry no floor", style="yellow", soft_wrap=True, highlight=False)
            continue
        label = device if precision == STRICT else f"{device}+{precision}"
        console.print(f"floor: {label} rates {describe(found)}", highlight=False)
    return rates


def seeded_by(options: RunOptions, keys: list, executor, spec) -> Callable | None:
    """The verdict over seeds of one spec (harness/seeded.py over_seeds), all but what the
    matrix gives it; None without --seeds."""
    from harness import matrix, seeded
    from harness.inputs import problem as inputs

    if options.seeds == 1:
        return None

    def built(again):
        apart = matrix.port_apart(spec.name, executor)
        return inputs.build_problem(again, options.data_dir, options.data_source, options.download, options.limits, apart)

    return functools.partial(seeded.over_seeds, spec, seeded.seeded_keys(keys, options.running), options.seeds, built)


def run_matrix(options: RunOptions, console: Console, loaded: list | None = None) -> tuple[list, Path | None, str, list[str]]:
    """`harness run`'s matrix: the specs the options name (or `loaded`, specs already
    loaded: the Python API's), their problems built, every run and check on the executor the
    options choose; the results, the records' folder, the run's id and the specs not run
    for want of their data."""
    from harness import matrix
    from harness.execute.capacity import INLINE, LOCAL
    from harness.inputs import problem as inputs
    from harness.inputs.port import PortError

    if loaded is None:
        loaded = [spec_load.load_spec(p, options.profile) for p in spec_paths(list(options.specs), options.specs_dir)]
    results_dir, keys = prepare(options, [spec.name for spec in loaded])
    ports = [spec.name for spec in loaded if spec.port is not None]
    also_runs(options.running, keys, console, ports, layers=len(ports) < len(loaded), records=results_dir is not None)
    # The local and inline executors are made before the problems (no process starts before
    # a job): a port's file then runs where its start check and torch's members will
    # (matrix.port_apart). Ray's is made once they are built (ray.init starts or joins a
    # cluster, which a spec's one-line data error need not wait for); a port's file then
    # runs in a fresh process.
    executor = make_executor(options) if executor_kind(options) in (INLINE, LOCAL) else None
    try:
        problems, ready, unread = [], [], []
        for spec in loaded:
            try:
                apart = matrix.port_apart(spec.name, executor)  # the driver never runs a port's file (it imports JAX)
                problems.append(inputs.build_problem(spec, options.data_dir, options.data_source, options.download, options.limits, apart))
                ready.append(spec)
                said = spec.spec.data
                if getattr(said, "kind", None) == "idx" and problems[-1].data_source != said.source:
                    console.print(
                        f"{spec.name}: its {said.source} files are not in the data folder; it runs on the real MNIST test-set files "
                        f"shipped with the harness (data source {problems[-1].data_source}: harness/data/mnist/README.md). "
                        f"--data-source {said.source} --download fetches the {said.source} files instead",
                        style="yellow",
                        highlight=False,
                        soft_wrap=True,
                    )
            except PortError as exc:  # the user's code failed before any run: the other specs run
                if len(loaded) == 1:
                    raise
                unread.append(spec.name)
                console.print(f"FAILED {spec.name}: {exc}", style="red", highlight=False, soft_wrap=True)
            except DataError as exc:
                if len(loaded) == 1:
                    raise
                # one spec's data missing (offline, say) keeps the others from nothing: they run
                unread.append(spec.name)
                console.print(f"SKIPPED {spec.name}, its data is not here: {exc}", style="yellow", highlight=False, soft_wrap=True)
        loaded = ready
        source = options.data_source
        without = [spec.name for spec in loaded if source and source not in (getattr(spec.spec.data, "sources", None) or {})]
        if without:  # a note, not a refusal: the GPU contact passes it to every phase (issue 55)
            console.print(
                f"--data-source {source}: {', '.join(without)} name no such source and run on their own data",
                style="yellow",
                highlight=False,
                soft_wrap=True,
            )
        rates = measure_rates(options, keys, console)
        run_id = write.new_id()
        executor = executor or make_executor(options)
        console.print(executor.slots.describe(), highlight=False)
        results = [
            matrix.run_cells(
                spec,
                problem,
                keys,
                results_dir,
                console,
                options.repeats,
                run_id,
                work_dir=options.work_dir,
                rates=rates,
                executor=executor,
                train_anyway=options.train_anyway,
                seeded=seeded_by(options, keys, executor, spec),
            )
            for spec, problem in zip(loaded, problems)
        ]
    finally:
        if executor is not None:
            executor.shutdown()
    return results, results_dir, run_id, unread
