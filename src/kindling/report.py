"""What a multirun found: its jobs and configurations in a table and a plot, read from its folders.

`python -m kindling.report <sweep folder>` writes, into that folder, `jobs.csv` (one row per job:
overrides, status, the optimized metric, the test metrics, run time, run folder),
`configurations.csv` (one row per configuration, its seeds and folds aggregated: mean, standard
deviation and count, best first), `report.md` (both tables, also printed) and `report.png` (each
job a point, per configuration). Hydra runs it at the end of every multirun
(kindling.multirun_report); everything is read from the job folders, so the report of an
interrupted multirun is rebuilt the same way. `python -m kindling.report <sweep> <later sweep>
...` reports a multirun together with those that extended it (more seeds, folds or trials).
"""

import csv
import io
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kindling import cli
from kindling.config.errors import UserError
from kindling.files import write_atomically
from kindling.run.job_record import JOB_FILE, RESULTS_FILE, TRIAL_FILE, read_yaml

# Overrides that repeat a configuration rather than change it: averaged over, as seeds are.
REPEAT_KEYS = ("seed", "data.fold")
# Written into the sweep folder.
JOBS_CSV, CONFIGURATIONS_CSV, MARKDOWN, PLOT = (
    "jobs.csv", "configurations.csv", "report.md", "report.png",
)  # fmt: skip
# Optuna's trial states, as the table names them.
TRIAL_STATUS = {"COMPLETE": "completed", "PRUNED": "pruned", "FAIL": "failed"}


@dataclass
class Job:
    folder: Path
    overrides: list[str]
    # completed, failed, pruned, or interrupted: started and never ended (killed, or running).
    status: str
    metrics: dict[str, float] = field(default_factory=dict)
    run_time_s: float | None = None

    @property
    def configuration(self) -> tuple[str, ...]:
        """The job's overrides less those that only repeat it (seed, fold)."""
        return tuple(o for o in self.overrides if override_key(o) not in REPEAT_KEYS)


@dataclass
class Configuration:
    overrides: tuple[str, ...]
    jobs: list[Job]

    @property
    def completed(self) -> list[Job]:
        return [job for job in self.jobs if job.status == "completed"]

    def values(self, metric: str) -> list[float]:
        return [job.metrics[metric] for job in self.completed if metric in job.metrics]


@dataclass
class Report:
    sweep_dir: Path
    metric: str | None  # the optimized metric
    maximize: bool
    jobs: list[Job]
    configurations: list[Configuration]  # best first

    @property
    def metrics(self) -> list[str]:
        """The optimized metric, then every test metric."""
        tests = sorted({name for job in self.jobs for name in job.metrics if name[:5] == "test/"})
        return [self.metric, *tests] if self.metric else tests


def override_key(override: str) -> str:
    """`model.optimizer.lr` of `model.optimizer.lr=0.01` (also of `+key=...`, `~key`)."""
    return override.split("=", 1)[0].lstrip("+~")


def read_job(folder: Path) -> Job:
    """A job as its folder records it, whether it completed, failed or was cut off."""
    record = read_yaml(folder / JOB_FILE) or {}
    results = read_yaml(folder / RESULTS_FILE) or {}
    trial = read_yaml(folder / TRIAL_FILE)
    if trial is not None:  # the sweeper's verdict: a pruned trial's run ends like any other
        status = TRIAL_STATUS.get(trial.get("state"), "interrupted")
    elif record.get("status") in ("completed", "failed"):
        status = record["status"]
    elif not record and results:  # a job run without the job record (an older multirun)
        status = "completed"
    else:
        status = "interrupted"
    metrics = {name: float(value) for name, value in results.items()}
    return Job(folder, read_yaml(folder / ".hydra" / "overrides.yaml") or [], status, metrics,
               record.get("run_time_s"))  # fmt: skip


def job_folders(sweep_dir: Path) -> list[Path]:
    """The folders of a multirun's jobs (those Hydra wrote a config into), by job number."""
    folders = [p.parent.parent for p in sweep_dir.glob("*/.hydra/overrides.yaml")]
    return sorted(folders, key=lambda p: (len(p.name), p.name))  # 2 before 10


def optimized_metric(folders: Sequence[Path]) -> tuple[str | None, bool]:
    """The optimized metric of the jobs' configs, and whether higher is better.

    An Optuna sweep says which (hydra.sweeper.direction); otherwise a loss, error or perplexity
    is better lower, anything else (accuracy, F1, ...) higher.
    """
    for folder in folders:
        config = read_yaml(folder / ".hydra" / "config.yaml") or {}
        metric = config.get("optimized_metric")
        if metric:
            hydra = (read_yaml(folder / ".hydra" / "hydra.yaml") or {}).get("hydra", {})
            direction = (hydra.get("sweeper") or {}).get("direction")
            if direction is None:
                lower = any(word in metric.lower() for word in ("loss", "err", "ppl", "perplex"))
                direction = "minimize" if lower else "maximize"
            return metric, direction == "maximize"
    return None, True


def build_report(sweep_dir: str | Path, *more_sweep_dirs: str | Path) -> Report:
    """Read every job folder of `sweep_dir` (and of `more_sweep_dirs`: a multirun extended
    later by another, with more seeds or trials); group the jobs into configurations, best
    first."""
    sweep_dir = Path(sweep_dir)
    folders = []
    for folder in (sweep_dir, *map(Path, more_sweep_dirs)):
        found = job_folders(folder)
        if not found:
            raise UserError(
                f"{folder} has no job folders (<number>/.hydra/overrides.yaml): give the folder "
                "of a multirun, logs/<task>/multiruns/<date>_<time>."
            )
        folders += found
    jobs = [read_job(folder) for folder in folders]
    metric, maximize = optimized_metric(folders)
    grouped: dict[tuple[str, ...], list[Job]] = {}
    for job in jobs:
        grouped.setdefault(job.configuration, []).append(job)
    configurations = [Configuration(overrides, members) for overrides, members in grouped.items()]

    def rank(configuration: Configuration) -> tuple[bool, float]:
        values = configuration.values(metric) if metric else []
        if not values:
            return True, 0.0  # nothing to compare: last
        mean = statistics.fmean(values)
        return False, -mean if maximize else mean

    configurations.sort(key=rank)  # stable: ties keep the order of their first job
    return Report(sweep_dir, metric, maximize, jobs, configurations)


def varying(overrides: Sequence[Sequence[str]]) -> set[str]:
    """The override keys whose values differ between the given override lists."""
    keys = {override_key(o) for os in overrides for o in os}
    values = {
        k: {next((o for o in os if override_key(o) == k), None) for os in overrides} for k in keys
    }
    return {key for key in keys if len(values[key]) > 1}


def label(overrides: Sequence[str], shown: set[str]) -> str:
    """The overrides that tell this job or configuration from the others of the multirun."""
    return " ".join(o for o in overrides if override_key(o) in shown)


def summary(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (None for fewer than two values)."""
    std = statistics.stdev(values) if len(values) > 1 else None
    return (statistics.fmean(values) if values else None), std


def number(value: float | None) -> str:
    """Four decimals, as accuracies and losses need; large values (perplexity) with fewer."""
    return "" if value is None else f"{value:.4f}" if abs(value) < 100 else f"{value:.4g}"


def job_rows(report: Report) -> list[dict[str, Any]]:
    shown = varying([job.overrides for job in report.jobs])
    return [
        {
            # The job number; with the multirun's folder where several are reported together.
            "job": str(job.folder.relative_to(report.sweep_dir.parent))
            if job.folder.parent != report.sweep_dir
            else job.folder.name,
            "overrides": label(job.overrides, shown),
            "status": job.status,
            **{name: job.metrics.get(name) for name in report.metrics},
            "run_time_s": None if job.run_time_s is None else round(job.run_time_s, 1),
            "folder": str(job.folder.resolve()),
        }
        for job in report.jobs
    ]


def configuration_rows(report: Report) -> list[dict[str, Any]]:
    shown = varying([c.overrides for c in report.configurations])
    rows = []
    for configuration in report.configurations:
        # A multirun of one configuration: name what it set, not nothing.
        name = label(
            configuration.overrides, shown or {override_key(o) for o in configuration.overrides}
        )
        row: dict[str, Any] = {
            "configuration": name or "(defaults)",
            "completed": len(configuration.completed),
            "jobs": len(configuration.jobs),
        }
        for metric in report.metrics:
            values = configuration.values(metric)
            row[f"{metric} mean"], row[f"{metric} std"] = summary(values)
            row[f"{metric} n"] = len(values)
        rows.append(row)
    return rows


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    text = io.StringIO()
    if rows:
        writer = csv.DictWriter(text, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
    write_atomically(path, lambda file: file.write(text.getvalue().encode()))


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *map(line, rows)])


def markdown(report: Report) -> str:
    """Both tables, configurations first: `mean ± std` over their completed jobs."""
    better = "higher" if report.maximize else "lower"
    title = f"Multirun {report.sweep_dir}: {len(report.jobs)} jobs"
    if report.metric:
        title += f"; {report.metric}, {better} is better"
    configurations = [
        [
            row["configuration"],
            f"{row['completed']}/{row['jobs']}",
            *(mean_and_std(row[f"{m} mean"], row[f"{m} std"]) for m in report.metrics),
        ]
        for row in configuration_rows(report)
    ]
    jobs = [
        [row["job"], row["overrides"], row["status"], *(number(row[m]) for m in report.metrics),
         "" if row["run_time_s"] is None else f"{row['run_time_s']:.1f}"]
        for row in job_rows(report)
    ]  # fmt: skip
    seeds = ", ".join(REPEAT_KEYS)
    return "\n\n".join([
        f"## {title}",
        f"Configurations, best first; mean ± standard deviation over the completed jobs ({seeds}):",
        markdown_table(["configuration", "completed", *report.metrics], configurations),
        "Jobs:",
        markdown_table(["job", "overrides", "status", *report.metrics, "run time (s)"], jobs),
    ]) + "\n"  # fmt: skip


def mean_and_std(mean: float | None, std: float | None) -> str:
    return number(mean) if std is None else f"{number(mean)} ± {number(std)}"


def plot(report: Report, path: Path) -> bool:
    """A panel per metric: per configuration, its completed jobs as points and mean ± std as a
    bar beside them. Nothing to draw (no completed job with a metric): no file, False."""
    metrics = [m for m in report.metrics if any(c.values(m) for c in report.configurations)]
    if not metrics:
        return False
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # only when there is a plot
    from matplotlib.figure import Figure

    # One override a line: a configuration of several stays narrow.
    names = [row["configuration"].replace(" ", "\n") for row in configuration_rows(report)]
    panel_width = max(3.0, 0.8 * len(names) + 1.2)
    figure = Figure(figsize=(panel_width * len(metrics), 4.0), layout="constrained")
    for n, metric in enumerate(metrics):
        axes = figure.add_subplot(1, len(metrics), n + 1)
        for x, configuration in enumerate(report.configurations):
            values = configuration.values(metric)
            if not values:
                continue
            # Spread a configuration's points a little sideways, so equal values stay visible.
            offsets = [0.2 * (i / max(1, len(values) - 1) - 0.5) for i in range(len(values))]
            axes.plot([x + o for o in offsets], values, "o", color="tab:blue", alpha=0.6)
            mean, std = summary(values)
            axes.errorbar([x + 0.25], [mean], yerr=[std or 0.0], fmt="_", color="black",
                          markersize=12, capsize=4)  # fmt: skip
        axes.set_xticks(range(len(names)), names, fontsize="small")
        axes.set_xlim(-0.5, len(names) - 0.5)
        axes.set_title(metric)
        axes.grid(axis="y", alpha=0.3)
    figure.suptitle("Each completed job a point; mean ± std beside")
    FigureCanvasAgg(figure)
    write_atomically(path, lambda file: figure.savefig(file, format="png", dpi=100))
    return True


def write_report(sweep_dir: str | Path, *more_sweep_dirs: str | Path) -> str:
    """Build the report of `sweep_dir` (and `more_sweep_dirs`) and write its files into
    `sweep_dir`; return its Markdown."""
    report = build_report(sweep_dir, *more_sweep_dirs)
    text = markdown(report)
    write_csv(report.sweep_dir / JOBS_CSV, job_rows(report))
    write_csv(report.sweep_dir / CONFIGURATIONS_CSV, configuration_rows(report))
    write_atomically(report.sweep_dir / MARKDOWN, lambda file: file.write(text.encode()))
    written = [JOBS_CSV, CONFIGURATIONS_CSV, MARKDOWN]
    if plot(report, report.sweep_dir / PLOT):
        written.append(PLOT)
    return f"{text}\nWritten to {report.sweep_dir}: {', '.join(written)}"


@dataclass
class ReportArgs:
    sweep_dirs: list[str]  # the multirun's folder, then those that extended it


USAGE = "python -m kindling.report <multirun folder> [<multirun that extended it> ...]"


@cli.main
def main(argv: Sequence[str]) -> None:
    args = cli.parse(ReportArgs, argv, USAGE, positional="sweep_dirs")
    print(write_report(*args.sweep_dirs))


if __name__ == "__main__":
    main(sys.argv[1:])
