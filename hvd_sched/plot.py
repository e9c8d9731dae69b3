"""A PNG of a schedule's learning rate (layer 5: matplotlib's Agg renderer, no display, no TensorFlow).

Imported only by `hvd-sched plot` (and users who want the picture), so `import hvd_sched` never pulls in
matplotlib. The curve comes from `Schedule.lr_at` (vectorised), the shaded span from `WARM_UP_ITERS` and the
marks from `Schedule.momentum_corrections`: the picture draws the schedule, it computes nothing of its own.

The marked corrections and the warmup span are also written into the PNG as text chunks
(`hvd_sched:corrections`, `hvd_sched:warmup`, `hvd_sched:schedule`, JSON), so a test or a script can read
back exactly what was drawn.

Examples:
    >>> import pathlib, tempfile, hvd_sched, hvd_sched.plot
    >>> schedule = hvd_sched.from_detectron("examples/configs/e2e_faster_rcnn_R-50-FPN_1x.yaml")
    >>> folder = tempfile.TemporaryDirectory()   # your own run: "lr.png"
    >>> info = hvd_sched.plot.plot_schedule(schedule, pathlib.Path(folder.name) / "lr.png", log_scale=True)
    >>> folder.cleanup()
    >>> info["corrections"]
    [(60000, 0.10000000894069672), (80000, 0.09999999403953552)]
"""

import json

import numpy as np

from ._version import __version__

__all__ = ["plot_end", "lr_curve", "correction_marks", "plot_schedule", "METADATA_KEYS"]

#: The PNG text chunks `plot_schedule` writes (values are JSON).
METADATA_KEYS = ("hvd_sched:corrections", "hvd_sched:warmup", "hvd_sched:schedule")

_MAX_POINTS = 4096  # a smooth curve at any size; every boundary and correction is added exactly
_MAX_ANNOTATED = 12  # past this many corrections the factors are not written next to the marks
_MAX_MARKS = 10000  # at most this many corrections are marked (an every-change rule can make millions)
_MAX_EDGES = 10000  # at most this many phase boundaries are drawn exactly (`step` with a tiny STEP_SIZE)


def plot_end(schedule):
    """The last iteration drawn: MAX_ITER, or the last LR change if that comes later.

    Args:
        schedule: an `hvd_sched.Schedule`.

    Returns:
        `max(schedule.max_iter, schedule.hold_iter)`.
    """
    return max(schedule.max_iter, schedule.hold_iter)


def correction_marks(schedule, stop=None):
    """The `(iteration, factor)` pairs the plot marks: `schedule.momentum_corrections(stop)` (the first 10000).

    Args:
        schedule: an `hvd_sched.Schedule`.
        stop: one past the last iteration considered (default `plot_end(schedule) + 1`).

    Returns:
        A list of `(iteration, factor)`, exactly what `plot_schedule` marks and writes into the PNG.
    """
    return schedule.momentum_corrections(plot_end(schedule) + 1 if stop is None else stop, limit=_MAX_MARKS)


def lr_curve(schedule, stop=None, max_points=_MAX_POINTS):
    """`(iterations, lrs)`: the LR at evenly spaced iterations in `[0, stop)` plus, exactly, every phase
    boundary, every correction and the iteration before each (so every jump is drawn where it happens).

    Args:
        schedule: an `hvd_sched.Schedule`.
        stop: one past the last iteration (default `plot_end(schedule) + 1`).
        max_points: the number of evenly spaced iterations.

    Returns:
        An int64 array of sorted iterations and the float32 `schedule.lr_at` of each.

    Raises:
        ValueError: for `stop < 1`.
    """
    stop = plot_end(schedule) + 1 if stop is None else int(stop)
    if stop < 1:
        raise ValueError(f"stop must be >= 1, got {stop}")
    points = [np.linspace(0, stop - 1, min(stop, max_points)).astype(np.int64)]
    boundaries = [piece.start for piece in schedule.pieces()] + schedule.boundaries()[:_MAX_EDGES]
    edges = np.array(boundaries + [it for it, _ in correction_marks(schedule, stop)], dtype=np.int64)
    points += [edges, edges - 1]
    iterations = np.unique(np.concatenate(points))
    iterations = iterations[(iterations >= 0) & (iterations < stop)]
    return iterations, schedule.lr_at(iterations)


def plot_schedule(schedule, path, *, log_scale=False, width=1000, height=500, dpi=100, title=None,
                  steps_per_epoch=None):
    """Write a PNG of the LR over `[0, plot_end(schedule)]`: warmup shaded, each momentum correction marked.

    Args:
        schedule: an `hvd_sched.Schedule`.
        path: the PNG file to write.
        log_scale: a logarithmic LR axis (steps of 10x become equal steps).
        width: the image width in pixels (>= 100).
        height: the image height in pixels (>= 100).
        dpi: dots per inch (the image is `width x height` pixels whatever the dpi).
        title: the plot title (default: the policy and BASE_LR).
        steps_per_epoch: if given, an epoch axis on top.

    Returns:
        `{"path", "width", "height", "corrections": [(iteration, factor), ...], "warmup": [0, WARM_UP_ITERS] or
        None}`: what was drawn.

    Raises:
        ValueError: for a size below 100 pixels or a non-positive dpi.
        OSError: if the file cannot be written.
    """
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 100:
            raise ValueError(f"{name} must be an int >= 100 pixels, got {value!r}")
    if isinstance(dpi, bool) or not isinstance(dpi, (int, float)) or dpi <= 0:
        raise ValueError(f"dpi must be a number > 0, got {dpi!r}")
    import matplotlib
    # A bare Figure saved as PNG renders with Agg: no pyplot, no display, and the caller's backend is untouched.
    from matplotlib.figure import Figure

    end = plot_end(schedule)
    iterations, lrs = lr_curve(schedule, end + 1)
    corrections = correction_marks(schedule, end + 1)
    warmup = [0, schedule.warm_up_iters] if schedule.warm_up_iters > 0 else None

    figure = Figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    axes = figure.add_subplot()
    axes.plot(iterations, lrs, color="tab:blue", linewidth=1.5, label="learning rate", drawstyle="steps-post")
    if warmup:
        axes.axvspan(0, warmup[1], color="tab:orange", alpha=0.2,
                     label=f"warmup ({schedule.warm_up_method}, {warmup[1]} its)")
    if corrections:
        marked = np.array([it for it, _ in corrections], dtype=np.int64)
        axes.scatter(marked, schedule.lr_at(marked), marker="v", s=40, color="tab:red", zorder=3,
                     label=f"momentum correction ({len(corrections)})")
        for it, factor in corrections:
            axes.axvline(it, color="tab:red", linewidth=0.6, linestyle="--", alpha=0.5)
            if len(corrections) <= _MAX_ANNOTATED:
                axes.annotate(f"x{factor:.3g}", (it, schedule.lr_at(it)), textcoords="offset points",
                              xytext=(4, 6), fontsize=8, color="tab:red")
    if log_scale:
        axes.set_yscale("log")
    axes.set_xlim(0, max(end, 1))
    axes.set_xlabel("iteration")
    axes.set_ylabel("learning rate" + (" (log scale)" if log_scale else ""))
    axes.set_title(title or f"{schedule.lr_policy}, BASE_LR {schedule.base_lr:g}, MAX_ITER {schedule.max_iter}")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(loc="best", fontsize=8)
    if steps_per_epoch:
        top = axes.secondary_xaxis("top", functions=(lambda it: it / steps_per_epoch,
                                                     lambda epoch: epoch * steps_per_epoch))
        top.set_xlabel("epoch")
    figure.tight_layout()  # rearranges inside the canvas; the pixel size stays width x height
    metadata = {
        "Title": axes.get_title(),
        "Software": f"hvd_sched {__version__} (matplotlib {matplotlib.__version__})",
        "hvd_sched:corrections": json.dumps(corrections),
        "hvd_sched:warmup": json.dumps(warmup),
        "hvd_sched:schedule": json.dumps(schedule.get_config(), sort_keys=True),
    }
    figure.savefig(path, format="png", dpi=dpi, metadata=metadata)
    return {"path": str(path), "width": width, "height": height, "corrections": corrections, "warmup": warmup}
