"""Command line: `python -m harness run|bench|sweep|validate|export|compare|report|schema|list|smoke`.

Exit codes: 0 all runs ok and every check passed; 1 a check failed or a run failed;
2 bad input (a spec, an option, a data file, the results folder, a spec past the resource
limits), with one clear message; 130 interrupted (Ctrl-C), with one line.
"""

from __future__ import annotations

import argparse
import errno
import sys
from pathlib import Path

from rich.console import Console

from harness import arguments, session
from harness.core.atomic import atomic_write, ensure_replaceable
from harness.core.errors import HarnessError
from harness.core.paths import PROJECT_ROOT, REFERENCE_DIR, SPECS_DIR
from harness.core.registry import (
    ADAPTERS,
    DEVICES,
)
from harness.inputs import resources
from harness.options import RunOptions
from harness.records import schema, write
from harness.run import progress
from harness.spec import load as spec_load
from harness.spec import model as spec_mod

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


def _finish_run(args: argparse.Namespace, console: Console, results: list, results_dir: Path | None, run_id: str, unread: list[str] = ()) -> int:
    from harness.report import table

    console.print(table.verdict_table(results, members=getattr(args, "members", False)))
    across = table.cross_host_table(results)
    if across is not None:
        console.print(across)
    seeded = table.seeds_table(results)
    if seeded is not None:
        console.print(seeded)
    workers = table.workers_line([record for r in results for record in r.records])
    if workers:
        console.print(workers, highlight=False)
    table.print_failures(console, results, f"see the records under {results_dir}" if results_dir is not None else "not written (--no-records)")
    if results_dir is not None:
        speeds = table.speed_table([record for r in results for record in r.records])
        if speeds is not None:
            console.print(speeds)
        console.print(f"{sum(len(r.paths) for r in results)} records written under {results_dir} (run {run_id})")
    if unread:
        names = ", ".join(unread)
        console.print(f"{len(unread)} spec(s) not run for want of their data: {names} (above: which file, and how to get it)", highlight=False)
    if table.failed(results):
        return EXIT_FAILED
    return EXIT_BAD_INPUT if unread else 0


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    results, results_dir, run_id, unread = session.run_matrix(RunOptions.from_args(args), console)
    return _finish_run(args, console, results, results_dir, run_id, unread)


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    from harness.report import table

    results, results_dir, run_id, unread = session.run_matrix(RunOptions.from_args(args), console)
    code = _finish_run(args, console, results, results_dir, run_id, unread)
    console.print(table.bench_table([record for r in results for record in r.records]))
    return code


def cmd_sweep(args: argparse.Namespace, console: Console) -> int:
    from harness import matrix
    from harness.inputs import problem as inputs

    options = RunOptions.from_args(args)
    points = []  # (the spec at one point of its sweep, the swept value); all valid before anything runs
    for path in session.spec_paths(args.specs, args.specs_dir):
        spec = spec_load.load_spec(path).spec
        if spec.sweep is None:
            if args.specs:
                raise HarnessError(f"{path}: sweep: the spec declares no sweep")
            continue
        for value in args.values or spec.sweep.values:
            (extra,) = spec_load.sweep_overrides(spec, [value])
            point = spec_load.load_spec(path, spec.sweep.profile, extra)
            resources.check(point, options.limits)
            points.append((point, value))
    results_dir, keys = session.prepare(options, [point.name for point, _ in points])
    rates = session.measure_rates(options, keys, console)
    run_id = write.new_id()
    results = []
    executor = session.make_executor(options)
    console.print(executor.slots.describe(), highlight=False)
    try:
        for i, (loaded, value) in enumerate(points, 1):
            problem = inputs.build_problem(loaded, options.data_dir, limits=options.limits, port_apart=matrix.port_apart(loaded.name, executor))
            key = loaded.spec.sweep.key
            console.rule(f"sweep point {i}/{len(points)}: {loaded.name}, {key} = {value}, {len(problem.x_train)} examples")
            run = matrix.run_cells(
                loaded, problem, keys, results_dir, console, options.repeats, run_id, work_dir=options.work_dir, rates=rates, executor=executor
            )
            results.append(run)
    finally:
        executor.shutdown()
    return _finish_run(args, console, results, results_dir, run_id)


def cmd_validate(args: argparse.Namespace, console: Console) -> int:
    from harness.inputs import problem as inputs

    for path in session.spec_paths(args.specs, args.specs_dir):
        loaded = spec_load.load_spec(path)
        checked = inputs.check_image_files(loaded, args.data_dir)  # the model's input against each image file here
        profiles = [spec_mod.FULL_PROFILE, *loaded.spec.profiles]
        for profile in profiles:  # and each point of its sweep: within the resource limits
            resources.check(spec_load.load_spec(path, profile), arguments.limits(args))
        for extra in spec_load.sweep_overrides(loaded.spec):
            resources.check(spec_load.load_spec(path, loaded.spec.sweep.profile, extra), arguments.limits(args))
        against = f"; input checked against {', '.join(checked)}" if checked else ""
        missing = inputs.unchecked_data(loaded, args.data_dir)
        unchecked = f"; data not checked, not found: {', '.join(missing)} (--data-dir)" if missing else ""
        console.print(f"{path}: ok ({loaded.name}; profiles: {', '.join(profiles)}{against}{unchecked})", highlight=False, soft_wrap=True)
    return 0


def cmd_export(args: argparse.Namespace, console: Console) -> int:
    import numpy as np

    from harness import matrix
    from harness.inputs import problem as inputs

    loaded = spec_load.load_spec(spec_load.resolve_spec(args.spec, args.specs_dir), args.profile)
    if loaded.port is not None:
        raise HarnessError(f"{loaded.path}: model.python: export trains the float64 oracle, which a port has none of; only harness run runs a port")
    out = args.out or Path("exports") / f"{loaded.name}-{loaded.profile}.npz"
    ensure_replaceable(out)  # before the oracle runs
    problem = inputs.build_problem(loaded, args.data_dir, args.data_source, args.download, arguments.limits(args))
    others = [p for p in loaded.spec.profiles if p != loaded.profile]
    shorter = f"; a profile of fewer steps is shorter: --profile {' or '.join(others)}" if loaded.profile == spec_mod.FULL_PROFILE and others else ""
    console.print(
        f"training the float64 oracle over all {problem.total_steps:,} steps of the {loaded.profile} profile for the export's loss curve "
        f"(minutes where the run is long: progress below{shorter})",
        highlight=False,
        soft_wrap=True,
    )
    arrays = {
        "x_train": problem.x_train,
        "y_train": problem.y_train,
        "bounds": np.asarray(problem.bounds, dtype=np.int64),
        "oracle_losses": matrix.oracle_curve(problem, console),
        "spec_json": np.asarray(loaded.spec.model_dump_json()),
        "spec_sha256": np.asarray(loaded.sha256),
        "profile": np.asarray(loaded.profile),
    }
    if problem.x_val is not None:
        arrays["x_val"], arrays["y_val"] = problem.x_val, problem.y_val
    if problem.batch_order is not None:
        arrays["batch_order"] = problem.batch_order
    arrays.update(problem.initial_params)
    arrays.update({f"kept_{name}": kept for name, kept in problem.masks.items()})  # dropout masks
    atomic_write(out, lambda f: np.savez_compressed(f, **arrays))
    console.print(f"wrote {out}: inputs of {loaded.name} ({loaded.profile}) and the oracle's loss curve", highlight=False)
    return 0


def cmd_compare(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    from harness.gate import compare

    findings = compare.compare(args.new, args.baseline)
    if args.all:
        table = Table(title=f"{args.new} against {args.baseline}")
        for column in ("spec", "run", "profile", "what", "baseline", "new", "verdict"):
            table.add_column(column)
        styles = {"regression": "red", "improved": "green", "ok": None}
        for f in findings:
            table.add_row(f.spec, f.run, f.profile, f.what, f.baseline, f.new, f.verdict, style=styles.get(f.verdict, "yellow"))
        console.print(table)
    else:
        for line in compare.summary(findings):
            style = (
                "red"
                if line.startswith("REGRESSION")
                else "green"
                if line.startswith("IMPROVED")
                else "yellow"
                if line.startswith("WARNING")
                else None
            )
            console.print(line, style=style, highlight=False, soft_wrap=True, markup=False)
    regressions = sum(f.verdict == "regression" for f in findings)
    compared = sum(not f.verdict.startswith(compare.NOT_COMPARED) for f in findings)
    console.print(f"{regressions} regression(s) in {compared} comparison(s)")
    if compared == 0:
        raise HarnessError(f"{args.new}: no record matched the baseline {args.baseline} ({compare.holdings(args.new, args.baseline)})")
    return EXIT_FAILED if regressions else 0


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    from harness.report import document as report

    out, doc = report.report(args.results, args.out, args.profile)
    console.print(f"wrote {out} (profile {doc.profile}) and {len(doc.figures)} figure(s) in {out.parent / report.FIGURES_DIR}", highlight=False)
    for profile, count in sorted(doc.others.items()):
        console.print(f"  not in its main tables: {count} record(s) of profile {profile} (--profile {profile} reports them)", highlight=False)
    return 0


def cmd_schema(args: argparse.Namespace, console: Console) -> int:
    from harness.spec import reference

    spec_schema = spec_load.json_schema()
    targets = {
        SPECS_DIR / "schema.json": spec_schema,
        PROJECT_ROOT / REFERENCE_DIR / "schema.json": schema.json_schema(),
        reference.REFERENCE_FILE: reference.markdown(spec_schema),
    }
    stale = []
    for path, text in targets.items():
        current = path.read_text() if path.exists() else None
        if current != text:
            stale.append(path)
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if args.check and stale:
        console.print(f"out of date: {', '.join(map(str, stale))} (run `python -m harness schema`)")
        return EXIT_FAILED
    console.print("schemas and the spec reference up to date" if args.check else f"wrote {len(targets)} files: the schemas and the spec reference")
    return 0


def cmd_smoke(args: argparse.Namespace, console: Console) -> int:
    import json

    from harness import smoke
    from harness.execute import probe

    paths = session.spec_paths(args.specs, args.specs_dir)
    frameworks = args.frameworks or list(ADAPTERS)
    devices = args.devices
    if devices is None:
        try:
            probe.require_gpu(frameworks)
            devices = list(DEVICES)
        except HarnessError as exc:
            console.print(f"the CPU only: {exc}", highlight=False)
            devices = ["cpu"]
    elif "gpu" in devices:
        probe.require_gpu(frameworks)
    if args.out is not None:
        ensure_replaceable(args.out)
    console.print(
        f"smoke: {len(paths)} spec(s), {args.steps} steps, on {', '.join(devices)}; each framework, device and precision in a fresh process"
    )

    def said(row) -> None:
        mark = (
            "[green]ok[/green]"
            if row.passed and row.status == "ok"
            else ("[yellow]skipped[/yellow]" if row.status == "skipped" else "[red]FAIL[/red]")
        )
        far = (
            "" if row.outputs_distance is None else f"  outputs {row.outputs_distance:.1e}, first loss {row.first_loss_distance:.1e} from the oracle"
        )
        console.print(f"  {mark} {row.spec} {row.label} ({row.seconds:.1f} s){far}", highlight=False)
        for problem in row.problems if row.status != "skipped" else [row.reason]:
            console.print(f"      {problem}", highlight=False, markup=False, soft_wrap=True)

    found = smoke.smoke(paths, frameworks, devices, args.steps, on_row=said)
    covered = found["coverage"]
    console.print(
        f"covered: layers {', '.join(covered['layers'])}; activations {', '.join(covered['activations'])}; "
        f"optimizers {', '.join(covered['optimizers'])}; recipes {', '.join(covered['recipes']) or 'none'}",
        highlight=False,
    )
    if covered["layers not exercised"]:
        console.print(f"not exercised by these specs: {', '.join(covered['layers not exercised'])}", style="yellow", highlight=False)
    versions = sorted({(r["label"].split("@")[0], r["version"]) for r in found["rows"] if r["version"]})
    for framework, version in versions:
        console.print(f"  {framework}: {version}", highlight=False)
    counts = found["counts"]
    console.print(
        f"smoke: {counts['ok']} of {len(found['rows'])} runs ok, {counts['skipped']} skipped, {counts['failed']} failed, in {found['seconds']:.0f} s"
        + (" (interrupted: the rows above are all it ran)" if found["interrupted"] else ""),
        highlight=False,
    )
    if args.out is not None:
        atomic_write(args.out, (json.dumps(found, indent=1, default=str) + "\n").encode())
        console.print(f"wrote {args.out}", highlight=False)
    if found["interrupted"]:
        return EXIT_INTERRUPTED
    return 0 if found["passed"] else EXIT_FAILED


def cmd_list(args: argparse.Namespace, console: Console) -> int:
    for name, path in spec_load.spec_paths().items():
        console.print(f"spec {name}: {path}", highlight=False)
    console.print(f"frameworks: {', '.join(ADAPTERS)} (+ oracle: the array-module code in float64)")
    console.print(f"devices: {', '.join(DEVICES)}")
    return 0


COMMANDS = {
    "run": cmd_run,
    "bench": cmd_bench,
    "sweep": cmd_sweep,
    "compare": cmd_compare,
    "report": cmd_report,
    "validate": cmd_validate,
    "export": cmd_export,
    "schema": cmd_schema,
    "list": cmd_list,
    "smoke": cmd_smoke,
}


def _say(line: str) -> None:
    Console(stderr=True, soft_wrap=True).print(line, style="red", highlight=False, markup=False)


def main(argv: list[str] | None = None) -> int:
    args = arguments.parser(__doc__.splitlines()[0]).parse_args(argv)
    console = progress.console()
    try:
        return COMMANDS[args.command](args, console)
    except HarnessError as exc:
        _say(f"error: {exc}")
        return EXIT_BAD_INPUT
    except OSError as exc:  # a path of the command line, or one made from it, too long for the system
        if exc.errno != errno.ENAMETOOLONG:
            raise
        _say(f"error: {exc.filename}: file name too long")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        _say("interrupted")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
