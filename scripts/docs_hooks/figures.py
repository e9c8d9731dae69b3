"""The benchmark figures of docs/results/benchmarks.md, drawn from docs/bench/*.json (loaded by generated.py).

One figure per benchmark kind, from the newest JSON of each (kind, row): the kind and the row are in the file
name, ``<UTC date-time>_<kind>[_<row>].json`` (bench/README.md, "Reproduce"). Each figure plots the headline
statistic of its script with its 95% bootstrap interval, one point per variant and per group (a row of the support
matrix, a rank count or a MAX_ITER), and comes with a table of the same numbers, a caption naming every data
file, its date and machine, and the command that reproduces it. Nothing here imports mkdocs; matplotlib (Agg)
only inside ``render``.
"""

import io
import json
import pathlib
import posixpath
import re

__all__ = ["KINDS", "Figure", "newest_files", "build", "render"]

# kind -> what is plotted. "sections": the JSON's summaries (each a mapping variant -> statistics); "metric": the
# headline statistic (bench/README.md, "Method"); "exclude": comparisons that are not about scheduling.
KINDS = {
    "apply_loop": {"title": "The optimizer alone (`bench/apply_loop.py`)", "sections": ("summary",),
                   "metric": "extra_us_paired", "axis": "extra µs per step over the reference (paired, CPU time)",
                   "exclude": ("baseline_xla_vs_baseline",)},
    "overhead": {"title": "`model.fit` on an MLP (`bench/overhead.py`)", "sections": ("ranks1", "ranks2"),
                 "metric": "ratio_median", "axis": "time per step / reference (ratio of medians, wall time)"},
    "conv_net": {"title": "`model.fit` on a conv net (`bench/conv_net.py`)", "sections": ("ranks1", "ranks2"),
                 "metric": "ratio_median", "axis": "time per step / reference (ratio of medians, wall time)"},
    "accumulation": {"title": "Gradient accumulation (`bench/accumulation.py`)", "sections": ("ranks1", "ranks2"),
                     "metric": "ratio_median", "axis": "time per update, k = 2 / k = 1 (ratio of medians, wall time)"},
    "preemption": {"title": "Waiting for a stop signal (`bench/preemption.py`)", "sections": ("ranks1", "ranks2"),
                   "metric": "ratio_median", "axis": "time per step / reference (ratio of medians, wall time)"},
    "scale": {"title": "Cost against MAX_ITER (`bench/scale.py`)", "sections": (),
              "metric": "ratio", "axis": "time / time at the smallest MAX_ITER (ratio of medians)"},
}
_SCALE_METRICS = ("fit_s", "show_s", "schedule_s", "corrections_s")
_NAME = re.compile(r"^(?P<stamp>[0-9T-]+)_(?P<kind>%s)(?:_(?P<row>[^_]+))?\.json$" % "|".join(KINDS))
_SECTION_LABELS = {"ranks1": "1 rank", "ranks2": "2 ranks"}


def newest_files(bench_dir):
    """``{kind: [(row, path, data), ...]}``: the newest file of each (kind, row), rows by Keras major then name.

    The row is the file name's, else the JSON's ``machine.stack_row``; files that name no row (older runs) are
    used only where no file of that kind names one.
    """
    newest = {}
    for path in sorted(pathlib.Path(bench_dir).glob("*.json")):
        match = _NAME.match(path.name)
        if not match:
            continue
        data = json.loads(path.read_text())
        row = match["row"] or data.get("machine", {}).get("stack_row")
        key = (match["kind"], row)
        if key not in newest or match["stamp"] > newest[key][0]:
            newest[key] = (match["stamp"], path, data)
    found = {}
    for (kind, row), (_, path, data) in newest.items():
        found.setdefault(kind, []).append((row, path, data))
    for kind, rows in found.items():
        if any(row for row, _, _ in rows):
            rows[:] = [entry for entry in rows if entry[0]]
        rows.sort(key=lambda entry: (entry[2].get("keras_major", 0), entry[0] or ""))
    return found


class Figure:
    """One figure: ``points`` are ``(panel, variant, group, value, low, high)``; ``references`` ``(panel, variant,
    group, median per step)``; ``sources`` the ``(path, data)`` it was drawn from."""

    def __init__(self, kind, points, references, sources, target):
        self.kind, self.points, self.references, self.sources, self.target = kind, points, references, sources, target
        self.spec = KINDS[kind]
        self.src_uri = f"results/figures/{kind}.svg"
        self.svg = None

    def _ordered(self, index):
        seen = []
        for point in self.points + self.references:
            if point[index] not in seen:
                seen.append(point[index])
        return seen

    def panels(self):
        return self._ordered(0)

    def groups(self):
        return self._ordered(2)

    def markdown(self, page_uri, root):
        """The figure's Markdown for the page at ``page_uri`` (links relative to it)."""
        here = posixpath.dirname(page_uri)
        image = posixpath.relpath(self.src_uri, here or ".")
        lines = [f"### {self.spec['title']}", "", f"![{self.spec['axis']}]({image})", "",
                 f"*{self.spec['axis'][0].upper()}{self.spec['axis'][1:]}; 95% bootstrap intervals.*", ""]
        for panel in self.panels():
            lines += _table(self, panel)
        lines += ["Data and the command that reproduces it:", ""]
        for path, data in self.sources:
            relative = path.resolve().relative_to(root.resolve()).as_posix()
            link = posixpath.relpath(relative.removeprefix("docs/"), here or ".")
            lines.append(f"- [`{relative}`]({link}): {_machine(data)}; `{data.get('command', '?')}`")
        return "\n".join(lines + [""])


def _fmt(kind, value, low=None, high=None):
    if KINDS[kind]["metric"].startswith("extra_us"):
        text = f"{value:+.1f}"
        return text if low is None else f"{text} [{low:.1f}, {high:.1f}]"
    return f"{value:.3f}" if low is None else f"{value:.3f} [{low:.3f}, {high:.3f}]"


def _table(figure, panel):
    groups = [group for group in figure.groups()
              if any(point[0] == panel and point[2] == group for point in figure.points + figure.references)]
    cells = {}
    for name, variant, group, value, low, high, *verdict in figure.points:
        if name == panel:
            text = _fmt(figure.kind, value, low, high)
            cells[variant, group] = f"{text} {verdict[0]}" if verdict and verdict[0] else text
    unit = "µs" if figure.spec["metric"].startswith("extra_us") else "ms"
    for name, variant, group, median_ms in figure.references:
        if name == panel:
            per_step = median_ms * 1000 if unit == "µs" else median_ms
            cells[f"{variant}, {unit} per step", group] = f"{per_step:.4g}"
    rows = []
    for variant, _ in cells:
        if variant not in rows:
            rows.append(variant)
    rows.sort(key=lambda row: not row.endswith(" per step"))
    header = [f"**{panel}**" if panel else ""] + [str(group) for group in groups]
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * len(groups) + "|"]
    for row in rows:
        label = f"`{row}`" if not row.endswith(" per step") else "`{}`{}".format(*row.split(",", 1))
        lines.append("| " + " | ".join([label] + [cells.get((row, group), "n/a") for group in groups]) + " |")
    return lines + [""]


def _machine(data):
    machine = data.get("machine", {})
    git = machine.get("git") or {}
    parts = [machine.get("date", "date unknown"), f"{machine.get('nproc', '?')} × {machine.get('cpu', '?')}",
             f"load {machine.get('loadavg_1min', '?')}"]
    stack = machine.get("stack_row")
    versions = ", ".join(f"{name} {machine[key]}" for name, key in
                         (("TensorFlow", "tensorflow"), ("Keras", "keras"), ("Horovod", "horovod")) if key in machine)
    parts.append(f"{stack} ({versions})" if stack else versions)
    if git.get("commit"):
        dirty = f" + changes to {', '.join(git['dirty'])}" if git.get("dirty") else ""
        parts.append(f"library at {git['commit'][:7]}{dirty}")
    return ", ".join(parts)


def _comparison_points(kind, rows):
    spec, points, references = KINDS[kind], [], []
    metric = spec["metric"]
    single_section = len(spec["sections"]) == 1
    for row, _, data in rows:
        for section in spec["sections"]:
            panel, group = ("", row) if single_section else (row if len(rows) > 1 else "", _SECTION_LABELS[section])
            for variant, stats in data.get(section, {}).items():
                if variant in spec.get("exclude", ()) or metric not in stats:
                    continue
                if stats.get("reference") == variant:
                    references.append((panel, variant, group, stats["median_ms"]))
                    continue
                low, high = stats[f"{metric}_ci95"]
                verdict = stats.get("verdict") if stats.get("verdict") != "no target" else None
                points.append((panel, variant, group, stats[metric], low, high, verdict))
    return points, references


def _scale_points(rows):
    points = []
    for _, _, data in rows:
        for policy, sizes in data["summary"].items():
            for size, stats in sorted(sizes.items(), key=lambda item: int(item[0])):
                label = f"{int(size):.0e}".replace("e+0", "e").replace("e+", "e")
                if float(label) != int(size):
                    label = f"{int(size):,}"
                for metric in _SCALE_METRICS:
                    ratio = stats[f"{metric}_ratio"]
                    points.append((policy, metric, f"MAX_ITER {label}", ratio["ratio"], *ratio["ci95"], None))
    return points, []


def build(bench_dir):
    """The figures (not yet drawn) of every kind found in ``bench_dir``, in ``KINDS`` order."""
    found = newest_files(bench_dir)
    figures = []
    for kind in KINDS:
        rows = found.get(kind)
        if not rows:
            continue
        points, references = _scale_points(rows) if kind == "scale" else _comparison_points(kind, rows)
        settings = rows[0][2].get("settings", {})
        target = settings.get("targets", {}).get("time_ratio") if kind == "scale" else settings.get("target")
        if kind in ("accumulation", "preemption") or KINDS[kind]["metric"].startswith("extra_us"):
            target = None  # no target there, or a target for ratios only
        figures.append(Figure(kind, points, references, [(path, data) for _, path, data in rows], target))
    return figures


def render(figure):
    """Draw ``figure`` (a forest plot: one row per variant, one marker per group) into ``figure.svg`` (bytes)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    pyplot.rcParams.update({"svg.hashsalt": "hvd_sched-docs", "svg.fonttype": "none", "font.size": 9})
    panels, groups = figure.panels(), figure.groups()
    variants = {panel: [] for panel in panels}
    for panel, variant, *_ in figure.points:
        if variant not in variants[panel]:
            variants[panel].append(variant)
    heights = [max(len(variants[panel]), 1) for panel in panels]
    fig, axes = pyplot.subplots(len(panels), 1, figsize=(7.5, 0.9 + 0.42 * sum(heights) + 0.5 * len(panels)),
                                gridspec_kw={"height_ratios": heights}, squeeze=False)
    colours = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
    zero = 0.0 if figure.spec["metric"].startswith("extra_us") else 1.0
    step = 0.6 / max(len(groups), 1)
    for axis, panel in zip(axes[:, 0], panels):
        names = variants[panel]
        for index, group in enumerate(groups):
            chosen = [point for point in figure.points if point[0] == panel and point[2] == group]
            if not chosen:
                continue
            offset = (index - (len(groups) - 1) / 2) * step
            ys = [len(names) - 1 - names.index(point[1]) - offset for point in chosen]
            xs = [point[3] for point in chosen]
            errors = [[point[3] - point[4] for point in chosen], [point[5] - point[3] for point in chosen]]
            axis.errorbar(xs, ys, xerr=errors, fmt="o", markersize=4, capsize=3, color=colours[index % 10],
                          label=group)
        axis.axvline(zero, color="0.4", linewidth=0.8)
        if figure.target is not None:
            axis.axvline(figure.target, color="0.4", linewidth=0.8, linestyle="--", label=f"target {figure.target}")
        axis.set_yticks(range(len(names)), list(reversed(names)))
        axis.set_ylim(-0.7, len(names) - 0.3)
        axis.grid(axis="x", color="0.9")
        axis.set_axisbelow(True)
        if panel:
            axis.set_title(panel, loc="left", fontsize=9, fontweight="bold")
        axis.legend(loc="best", fontsize=8)
    axes[-1, 0].set_xlabel(figure.spec["axis"])
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    pyplot.close(fig)
    figure.svg = buffer.getvalue()
    return figure.svg
