"""What a multirun found, read from its job folders (docs/sweeps.md, *Comparing configurations
honestly*): `python -m kindling.report <sweep folder> [<multirun that extended it> ...]` writes
into the first folder `jobs.csv` (one row per job), `configurations.csv` (one row per
configuration, its seeds and folds aggregated: mean, standard deviation and count, best first),
`report.md` (both tables, also printed) and `report.png` (each job a point, per configuration).
Hydra runs it at the end of every multirun (kindling.multirun_report.MultirunReport).
"""

import itertools
import shlex
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from kindling import cli
from kindling.errors import UserError
from kindling.files import write_atomically
from kindling.run.job_record import JOB_FILE, RESULTS_FILE, TRIAL_FILE
from kindling.run.provenance import key

# Overrides that repeat a configuration rather than change it: averaged over.
REPEAT_KEYS = ("seed", "data.fold")
MARKDOWN = "report.md"
TRIAL_STATUS = {"COMPLETE": "completed", "PRUNED": "pruned", "FAIL": "failed"}  # Optuna's states


@dataclass
class Job:
    folder: Path
    overrides: list[str]
    status: str  # completed, failed, pruned, interrupted (started, never ended), not started
    metrics: dict[str, float]
    run_time_s: float | None


@dataclass
class Report:
    sweep_dir: Path
    metric: str | None  # the optimized metric
    maximize: bool
    jobs: list[Job]
    configurations: dict[tuple[str, ...], list[Job]]  # the overrides less REPEAT_KEYS, best first
    metrics: list[str]  # the optimized metric, then every test metric
    damaged: list[str]  # one line per record file that could not be read, and what it left out


class DamagedRecord(Exception):
    """A record file of a job that is not valid YAML (a full disk, a hand edit)."""


def read_yaml(path: Path) -> Any:
    """The file's YAML; None where there is no file."""
    if not path.is_file():
        return None
    try:
        return yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        where = getattr(error, "problem_mark", None)
        at = f" at line {where.line + 1}" if where else ""
        raise DamagedRecord(f"{path} is not valid YAML{at}") from error


def read_job(folder: Path) -> Job:
    """A job as its folder records it, whether it completed, failed or was cut off."""
    record = read_yaml(folder / JOB_FILE) or {}
    trial = read_yaml(folder / TRIAL_FILE)  # the sweeper's verdict: a pruned run ends as any other
    status = TRIAL_STATUS.get(trial.get("state")) if trial else record.get("status")
    if status not in ("completed", "failed", "pruned"):  # started and never ended
        status = "interrupted"
    overrides = read_yaml(folder / ".hydra" / "overrides.yaml") or []
    metrics = read_yaml(folder / RESULTS_FILE) or {}
    return Job(folder, overrides, status, metrics, record.get("run_time_s"))


def multirun_hydra(sweep_dir: Path) -> dict[str, Any]:
    """The `hydra` node Hydra saved at the multirun's start (`multirun.yaml`); {} without it."""
    return (read_yaml(sweep_dir / "multirun.yaml") or {}).get("hydra") or {}


def planned_jobs(sweep_dir: Path) -> list[list[str]]:
    """Every job's overrides that a multirun of Hydra's basic sweeper runs, in its order (the
    order that numbers the jobs: the product of the swept values, as the sweeper takes it); none
    for other sweepers, whose trials are not known ahead."""
    hydra = multirun_hydra(sweep_dir)
    if not str((hydra.get("sweeper") or {}).get("_target_", "")).endswith(".BasicSweeper"):
        return []
    params = [f"{k}={v}" for k, v in ((hydra.get("sweeper") or {}).get("params") or {}).items()]
    task = (hydra.get("overrides") or {}).get("task") or []
    parsed = OverridesParser.create().parse_overrides([*params, *task])
    values = {}
    for override in parsed:
        name = override.get_key_element()
        swept = override.is_discrete_sweep()
        values[name] = [f"{name}={v}" for v in override.sweep_string_iterator()] if swept else [
            f"{name}={override.get_value_element_as_str()}"]  # fmt: skip
    return [list(job) for job in itertools.product(*values.values())]


def continue_command(sweep_dir: Path) -> str:
    """The command that runs a cut-off multirun's unfinished jobs (kindling.run.continuation)."""
    overrides = multirun_hydra(sweep_dir).get("overrides")
    if not overrides:  # no record of the command: the user's own
        return f"Continue it with its command and hydra.sweep.dir={sweep_dir}."
    # The command's own (hydra/launcher=joblib, ...), less what Hydra adds and the folder.
    ours = [o for o in overrides["hydra"] if key(o) not in ("hydra.mode", "hydra.sweep.dir")]
    arguments = shlex.join([*overrides["task"], *ours, f"hydra.sweep.dir={sweep_dir}"])
    return f"Continue it with: python train.py -m {arguments}"


def optimized_metric(folders: Sequence[Path]) -> tuple[str | None, bool]:
    """The jobs' optimized metric, and whether higher is better: as an Optuna sweep says
    (hydra.sweeper.direction), else lower for a loss, error or perplexity, higher for the rest."""
    for folder in folders:
        try:
            metric = (read_yaml(folder / ".hydra" / "config.yaml") or {}).get("optimized_metric")
            hydra = (read_yaml(folder / ".hydra" / "hydra.yaml") or {}).get("hydra", {})
        except DamagedRecord:  # the next job's say the same
            continue
        if metric:
            direction = (hydra.get("sweeper") or {}).get("direction")
            if direction is None:
                lower = any(word in metric.lower() for word in ("loss", "err", "ppl", "perplex"))
                direction = "minimize" if lower else "maximize"
            return metric, direction == "maximize"
    return None, True


def completed(jobs: list[Job], metric: str) -> list[float]:
    return [
        job.metrics[metric] for job in jobs if job.status == "completed" and metric in job.metrics
    ]


def build_report(*sweep_dirs: str | Path) -> Report:
    """Every job of the multiruns `sweep_dirs` (the first, then those that extended it with more
    seeds, folds or trials), grouped into configurations, best first."""
    folders = []
    for sweep_dir in map(Path, sweep_dirs):
        found = [p.parent.parent for p in sweep_dir.glob("*/.hydra/overrides.yaml")]
        if not found:
            raise UserError(
                f"{sweep_dir} has no job folders (<number>/.hydra/overrides.yaml): give the "
                "folder of a multirun, logs/<task>/multiruns/<date>_<time>."
            )
        folders += sorted(found, key=lambda p: (len(p.name), p.name))  # job 2 before job 10
    jobs, damaged = [], []
    for folder in folders:
        try:
            jobs.append(read_job(folder))
        except DamagedRecord as error:
            damaged.append(f"{error}: job {folder.name} is left out of the report.")
    for sweep_dir in map(Path, sweep_dirs):  # the jobs a cut-off multirun never started
        planned = planned_jobs(sweep_dir)
        started = {folder.name for folder in folders if folder.parent == sweep_dir}
        jobs += [
            Job(sweep_dir / str(number), overrides, "not started", {}, None)
            for number, overrides in enumerate(planned)
            if str(number) not in started
        ]
    if not jobs:
        raise UserError(f"No job of {sweep_dirs[0]} could be read: {damaged[0]}")
    metric, maximize = optimized_metric(folders)
    tests = sorted({name for job in jobs for name in job.metrics if name.startswith("test/")})
    configurations: dict[tuple[str, ...], list[Job]] = {}
    for job in jobs:
        overrides = tuple(o for o in job.overrides if key(o) not in REPEAT_KEYS)
        configurations.setdefault(overrides, []).append(job)

    def rank(configuration: tuple[tuple[str, ...], list[Job]]) -> tuple[bool, float]:
        values = completed(configuration[1], metric) if metric else []
        mean = statistics.fmean(values) if values else 0.0
        return not values, -mean if maximize else mean  # nothing to compare: last

    ranked = dict(sorted(configurations.items(), key=rank))  # ties keep their first job's order
    metrics = [metric, *tests] if metric else tests
    return Report(Path(sweep_dirs[0]), metric, maximize, jobs, ranked, metrics, damaged)


def varying(among: Sequence[Sequence[str]]) -> set[str]:
    """The override keys whose values differ between the override lists `among`."""
    keys = {key(o) for overrides in among for o in overrides}
    return {k for k in keys if len({tuple(o for o in os if key(o) == k) for os in among}) > 1}


def label(overrides: Sequence[str], shown: set[str]) -> str:
    """The overrides that tell these from the others: those of the keys `shown`."""
    return " ".join(o for o in overrides if key(o) in shown)


def job_rows(report: Report) -> list[dict[str, Any]]:
    shown = varying([job.overrides for job in report.jobs])
    return [
        {
            # The job number; with its multirun's folder where several are reported together.
            "job": job.folder.name
            if job.folder.parent == report.sweep_dir
            else str(job.folder.relative_to(report.sweep_dir.parent)),
            "overrides": label(job.overrides, shown),
            "status": job.status,
            **{name: job.metrics.get(name) for name in report.metrics},
            "run_time_s": None if job.run_time_s is None else round(job.run_time_s, 1),
            "folder": str(job.folder.resolve()),
        }
        for job in report.jobs
    ]


def configuration_rows(report: Report) -> list[dict[str, Any]]:
    shown = varying(list(report.configurations))
    rows = []
    for overrides, jobs in report.configurations.items():
        # A multirun of one configuration: named by what it set, not by nothing.
        name = label(overrides, shown or {key(o) for o in overrides})
        row: dict[str, Any] = {
            "configuration": name or "(defaults)",
            "completed": sum(job.status == "completed" for job in jobs),
            "jobs": len(jobs),
        }
        for metric in report.metrics:
            values = completed(jobs, metric)
            row[f"{metric} mean"] = statistics.fmean(values) if values else None
            row[f"{metric} std"] = statistics.stdev(values) if len(values) > 1 else None
            row[f"{metric} n"] = len(values)
        rows.append(row)
    return rows


def number(value: float | None) -> str:
    """Four decimals, as accuracies and losses need; large values (perplexity) with fewer."""
    return "" if value is None else f"{value:.4f}" if abs(value) < 100 else f"{value:.4g}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *map(line, rows)])


def markdown(report: Report) -> str:
    """Both tables, configurations first: `mean ± std` over their completed jobs."""
    title = f"Multirun {report.sweep_dir}: {len(report.jobs)} jobs"
    if report.metric:
        title += f"; {report.metric}, {'higher' if report.maximize else 'lower'} is better"

    def mean_and_std(row: dict[str, Any], metric: str) -> str:
        mean, std = number(row[f"{metric} mean"]), row[f"{metric} std"]
        return mean if std is None else f"{mean} ± {number(std)}"

    configurations = [
        [row["configuration"], f"{row['completed']}/{row['jobs']}",
         *(mean_and_std(row, m) for m in report.metrics)]
        for row in configuration_rows(report)
    ]  # fmt: skip
    jobs = [
        [row["job"], row["overrides"], row["status"], *(number(row[m]) for m in report.metrics),
         "" if row["run_time_s"] is None else f"{row['run_time_s']:.1f}"]
        for row in job_rows(report)
    ]  # fmt: skip
    return "\n\n".join([
        f"## {title}",
        "Configurations, best first; mean ± standard deviation over the completed jobs "
        f"({', '.join(REPEAT_KEYS)}):",
        markdown_table(["configuration", "completed", *report.metrics], configurations),
        "Jobs:",
        markdown_table(["job", "overrides", "status", *report.metrics, "run time (s)"], jobs),
    ]) + "\n"  # fmt: skip


def plot(report: Report, path: Path) -> bool:
    """A panel per metric: per configuration, its completed jobs as points and mean ± std as a
    bar beside them. Nothing to draw (no completed job with a metric): no file, False."""
    groups = list(report.configurations.values())
    metrics = [m for m in report.metrics if any(completed(jobs, m) for jobs in groups)]
    if not metrics:
        return False
    import numpy
    from matplotlib.figure import Figure  # only when there is a plot

    # One override a line: a configuration of several stays narrow.
    names = [row["configuration"].replace(" ", "\n") for row in configuration_rows(report)]
    width = max(3.0, 0.8 * len(names) + 1.2)
    figure = Figure(figsize=(width * len(metrics), 4.0), layout="constrained")
    panels = figure.subplots(1, len(metrics), squeeze=False)[0]
    for axes, metric in zip(panels, metrics, strict=True):
        for x, jobs in enumerate(groups):
            if values := completed(jobs, metric):
                # Spread the points a little sideways, so equal values stay visible.
                spread = numpy.linspace(x - 0.1, x + 0.1, len(values))
                axes.plot(spread, values, "o", color="tab:blue", alpha=0.6)
                std = statistics.stdev(values) if len(values) > 1 else 0.0
                axes.errorbar([x + 0.25], [statistics.fmean(values)], yerr=[std], fmt="_",
                              color="black", markersize=12, capsize=4)  # fmt: skip
        axes.set_xticks(range(len(names)), names, fontsize="small")
        axes.set_xlim(-0.5, len(names) - 0.5)
        axes.set_title(metric)
        axes.grid(axis="y", alpha=0.3)
    figure.suptitle("Each completed job a point; mean ± std beside")
    write_atomically(path, lambda file: figure.savefig(file, format="png", dpi=100))
    return True


def write_report(*sweep_dirs: str | Path) -> str:
    report = build_report(*sweep_dirs)
    text = markdown(report)
    for name, rows in (("jobs.csv", job_rows(report)),
                       ("configurations.csv", configuration_rows(report))):  # fmt: skip
        cli.write_csv(report.sweep_dir / name, list(rows[0]), (row.values() for row in rows))
    write_atomically(report.sweep_dir / MARKDOWN, lambda file: file.write(text.encode()))
    written = ["jobs.csv", "configurations.csv", MARKDOWN]
    if plot(report, report.sweep_dir / "report.png"):
        written.append("report.png")
    unfinished = [job for job in report.jobs if job.status in ("interrupted", "not started")]
    how_on = [f"{len(unfinished)} jobs did not finish. {continue_command(report.sweep_dir)}"]
    return "\n".join([
        text, *report.damaged, f"Written to {report.sweep_dir}: {', '.join(written)}",
        *(how_on if unfinished else []),
    ])  # fmt: skip


@dataclass
class ReportArgs:
    sweep_dirs: list[str]  # the multirun's folder, then those that extended it


@cli.command(ReportArgs, "python -m kindling.report <multirun> [<multirun that extended it> ...]",
             positional="sweep_dirs")  # fmt: skip
def main(args: ReportArgs) -> None:
    print(write_report(*args.sweep_dirs))


if __name__ == "__main__":
    main()
