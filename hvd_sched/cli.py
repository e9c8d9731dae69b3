"""`hvd-sched`: look at a Detectron-style solver config without TensorFlow (layer 5: an entry point).

    hvd-sched show  CONFIG [--world-size N] [--steps-per-epoch S]     the phases, LRs and momentum corrections
    hvd-sched plot  CONFIG -o lr.png [--log] [--width PX --height PX]  a PNG of the LR (matplotlib, Agg)
    hvd-sched check CONFIG [--world-size N] [--steps-per-epoch S]     validate: every problem, or a summary

`CONFIG` is a Detectron YAML file (only its `SOLVER` section is read). `--world-size` applies the linear
scaling of `REFERENCE_WORLD_SIZE` by `N x ITER_SIZE` (without it the config is shown as written, for its
reference size: `REFERENCE_WORLD_SIZE / ITER_SIZE` ranks); `--steps-per-epoch` (optimizer updates per epoch)
converts the `*_EPOCHS` keys. Iterations count optimizer updates, each of ITER_SIZE micro-batches per rank. Also
runs as `python -m hvd_sched.cli`.

Exit status: 0 on success; 2 for bad input (usage, missing file, malformed YAML, invalid values), reported as
messages on stderr, never a traceback. Imports numpy and PyYAML only (matplotlib for `plot`).
"""

import argparse
import bisect
import os
import re
import sys
import warnings

import numpy as np

from . import dialects, policies
from .config import EPOCH_KEYS, from_detectron, load_solver

__all__ = ["main", "collect_problems", "phases", "EXIT_OK", "EXIT_BAD_INPUT"]

EXIT_OK = 0
EXIT_BAD_INPUT = 2
#: `check` converts epoch keys with this many steps per epoch when `--steps-per-epoch` is not given.
PROVISIONAL_STEPS_PER_EPOCH = 1000

_INPUT_ERRORS = (ValueError, TypeError)
_MAX_ROWS = 40  # phase rows of a long `step` policy shown before the middle is folded into one row
#: `show` and `check` stop counting momentum corrections here (an every-change rule on a long continuous
#: policy corrects at every float32 LR change: tens of millions of iterations).
MAX_CORRECTIONS = 10000
_STEP_POLICIES = ("steps_with_decay", "steps_with_lrs", "steps_with_relative_lrs")
_HINTS = (("steps_per_epoch is required", "pass --steps-per-epoch S"),
          ("requires the world_size argument", "pass --world-size N"))


class _BadInput(Exception):
    """Input the user must fix; `problems` are printed one per line and the exit status is 2."""

    def __init__(self, problems, *, about_config=True):
        super().__init__("; ".join(problems))
        self.problems = list(problems)
        self.about_config = about_config


def _fmt(value):
    """The shortest text that reads back as the same float32 (`0.02`, not `0.019999999552965164`)."""
    return str(np.float32(value))


def _with_hint(message):
    for needle, hint in _HINTS:
        if needle in message:
            return f"{message} ({hint})"
    return message


def _named_keys(error, keys):
    """The config keys an error message names (on the innermost cause, without from_detectron's notes)."""
    while isinstance(error.__cause__, _INPUT_ERRORS):
        error = error.__cause__
    message = str(error)
    # The hints name other keys ("did you mean", "valid keys", another dialect's): not the keys at fault.
    message = re.split(r"; did you mean |; valid keys: | \(a [^)]* key: pass ", message)[0]
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message))
    return [key for key in keys if (key in words if isinstance(key, str) else repr(key) in message)]


def collect_problems(section, *, steps_per_epoch=None, world_size=None, dialect="detectron"):
    """Validate a SOLVER mapping and list every problem, not only the first.

    `from_detectron` stops at the first error. Each error names the keys at fault, so those keys are set back
    to their defaults and the rest is validated again, until it passes. An error that names a key already set
    back is a consequence of that (e.g. LR_POLICY without its STEPS) and is not reported twice.

    Args:
        section: a mapping of SOLVER keys.
        steps_per_epoch: passed to `from_detectron`.
        world_size: passed to `from_detectron`.

    Returns:
        `(schedule, problems)`: the Schedule and `[]` if valid, else `None` and the messages.
    """
    remaining, removed, problems = dict(section), [], []
    for _ in range(len(section) + 1):
        try:
            schedule = from_detectron(remaining, steps_per_epoch=steps_per_epoch, world_size=world_size,
                                      dialect=dialect)
        except _INPUT_ERRORS as error:
            named = _named_keys(error, list(remaining))
            if not _named_keys(error, removed):
                problems.append(_with_hint(str(error)))
            if not named:
                break
            for key in named:
                del remaining[key]
            removed += named
        else:
            return (None, problems) if problems else (schedule, [])
    return None, problems


def _positive_int(value):
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _iter_size(section):
    """The config's ITER_SIZE when it is valid, else 1 (`from_detectron` reports an invalid one)."""
    iter_size = section.get("ITER_SIZE", 1)
    return iter_size if _positive_int(iter_size) else 1


def _world_size(section, given):
    """`--world-size`, else the ranks the config was written for (REFERENCE_WORLD_SIZE / ITER_SIZE), else None.

    REFERENCE_WORLD_SIZE counts ranks x ITER_SIZE; when ITER_SIZE does not divide it, no number of ranks runs the
    config as written, and its REFERENCE_WORLD_SIZE ranks are shown (`_load` notes the scaling).
    """
    if given is not None:
        return given, None
    reference = section.get("REFERENCE_WORLD_SIZE", 0)
    if _positive_int(reference):
        iter_size = _iter_size(section)
        if iter_size > 1 and reference % iter_size == 0:
            ranks = reference // iter_size
            return ranks, (f"world size {ranks} (REFERENCE_WORLD_SIZE {reference} / ITER_SIZE {iter_size}; pass "
                           "--world-size N to scale)")
        return reference, f"world size {reference} (REFERENCE_WORLD_SIZE; pass --world-size N to scale)"
    return None, None


def _load(args, *, provisional_steps=False):
    """`(schedule, notes)` for the CONFIG of `args`, or `_BadInput` with every problem."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            section = load_solver(args.config)
    except OSError as error:
        raise _BadInput([f"cannot read {args.config}: {error.strerror or error}"]) from None
    except ValueError as error:
        raise _BadInput([str(error)]) from None
    world_size, note = _world_size(section, args.world_size)
    notes = [str(warning.message) for warning in caught] + ([note] if note else [])
    notes += [f"{key} has no effect in {dialects.LABELS[args.dialect]}: {why}"
              for key, why in dialects.NO_EFFECT.get(args.dialect, {}).items() if key in section]
    reference, iter_size = section.get("REFERENCE_WORLD_SIZE", 0), _iter_size(section)
    if _positive_int(reference) and world_size is not None and reference != world_size * iter_size:
        ranks = f"world size {world_size}" + (f" x ITER_SIZE {iter_size}" if iter_size > 1 else "")
        notes.append(f"LR scaled linearly by {ranks} / REFERENCE_WORLD_SIZE {reference}")
    steps_per_epoch = args.steps_per_epoch
    epoch_keys = [key for key in section if key in EPOCH_KEYS]
    if epoch_keys and steps_per_epoch is None:
        if not provisional_steps:
            raise _BadInput([f"{args.config} gives {', '.join(epoch_keys)} in epochs; pass --steps-per-epoch S "
                             "(train_keras.py prints it)"])
        steps_per_epoch = PROVISIONAL_STEPS_PER_EPOCH
        notes.append(f"epoch keys checked with a provisional --steps-per-epoch {steps_per_epoch}")
    schedule, problems = collect_problems(section, steps_per_epoch=steps_per_epoch, world_size=world_size,
                                          dialect=args.dialect)
    if problems:
        raise _BadInput(problems)
    return schedule, notes


def _stage_index(schedule, it):
    policy = schedule.lr_policy
    if policy in _STEP_POLICIES:
        return bisect.bisect_right(schedule.steps, it) - 1
    if policy == "step":
        return min(it, schedule.max_iter) // schedule.step_size
    if policy == "variable_stepsize":
        return bisect.bisect_right(policies.stage_ends(schedule.step_sizes), it)
    return None


def phases(schedule):
    """The rows of `hvd-sched show`'s phase table.

    Args:
        schedule: an `hvd_sched.Schedule`.

    Returns:
        One `(name, start, end, lr_at(start), lr_at(end - 1))` per interval between consecutive
        `schedule.boundaries()` (name: `warmup (method)`, `step k` or the policy), then
        `("end", last boundary, None, lr_at(last boundary), None)`: the LR held from there on.
    """
    points, folded = _phase_points(schedule)
    rows = []
    for start, end in zip(points, points[1:]):
        name = f"warmup ({schedule.warm_up_method})" if schedule.dialect == "detectron" else "warmup"
        parts = [name] if start < schedule.warmup_end else []
        stage = _stage_index(schedule, start)
        if start in folded:
            parts.append(f"steps {stage}..{_stage_index(schedule, end - 1)} (every {schedule.step_size} its)")
        elif stage is None:
            parts.append(schedule.lr_policy)
        elif stage > 0 or not parts:
            parts.append(f"step {stage}")
        rows.append((" + ".join(parts), start, end, schedule.lr_at(start), schedule.lr_at(end - 1)))
    rows.append(("end", points[-1], None, schedule.lr_at(points[-1]), None))
    return rows


def _phase_points(schedule):
    """`schedule.boundaries()`, except that a `step` policy of more than `_MAX_ROWS` decays keeps its first
    and last `_MAX_ROWS // 2` and folds the rest into one row; returns `(points, folded row starts)`."""
    if schedule.lr_policy != "step" or schedule.max_iter // schedule.step_size <= _MAX_ROWS:
        return schedule.boundaries(), set()
    size, decays = schedule.step_size, schedule.max_iter // schedule.step_size
    half = _MAX_ROWS // 2
    kept = [k * size for k in range(1, half + 1)] + [k * size for k in range(decays - half + 1, decays + 1)]
    points = sorted({0, schedule.max_iter, *kept, *(p for p in (schedule.warm_up_iters,) if p > 0)})
    return points, {half * size}


def _table(header, rows):
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    return ["  " + "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip()
            for row in (header, *rows)]


def _count(corrections):
    """The number of corrections, or "more than MAX_CORRECTIONS (the first MAX_CORRECTIONS listed)"."""
    if len(corrections) > MAX_CORRECTIONS:
        return f"more than {MAX_CORRECTIONS} (the first {MAX_CORRECTIONS} listed)"
    return str(len(corrections))


def _dialect_warmup(schedule):
    """The warmup of a Large-Scale-VRD or video-nonlocal-net schedule in words (None for Detectron's)."""
    if schedule.dialect == "large_scale_vrd":
        parts = [f"WARM_UP_LR {_fmt(schedule.warm_up_lr)} for {schedule.warm_up_iters} its"] \
            if schedule.warm_up_iters else []
        if schedule.gradual_increase_lr:
            parts.append(f"gradual increase by {schedule.gradual_lr_step:g} per it to BASE_LR")
        return ", then ".join(parts) or "no warmup"
    if schedule.dialect == "video_nonlocal":
        return (f"linear warmup from {_fmt(schedule.warm_up_lr)} to the policy LR at iteration "
                f"{schedule.warm_up_iters}" if schedule.warm_up_iters else "no warmup")
    return None


def _parameter_rules(schedule):
    """The per-parameter weight decay and LR rules `build_optimizer` applies, for this schedule's dialect."""
    wd = f"{schedule.weight_decay:g}"
    if schedule.dialect == "video_nonlocal":
        return (f"weight decay {wd} on kernels and biases (no bias rule), {schedule.weight_decay_bn:g} on "
                f"BatchNorm parameters (WEIGHT_DECAY_BN); Nesterov {'on' if schedule.nesterov else 'off'}")
    scales = (f"{schedule.weight_decay_gn:g} on norm scales (WEIGHT_DECAY_GN)" if schedule.dialect == "detectron"
              else f"{wd} on norm scales (no norm rule)")
    return f"weight decay {wd} on kernels, 0 on biases and norm shifts at 2x LR, {scales}"


def _correction_rule(schedule):
    mode = schedule.correction_mode
    if mode == "threshold":
        return f"when the LR ratio exceeds SCALE_MOMENTUM_THRESHOLD {schedule.scale_momentum_threshold:g}"
    if mode == "any_change":
        return "at every change of the unrounded LR (Large-Scale-VRD)"
    if mode == "relative_change":
        return "when abs(new - cur) > 1e-7 * new (video-nonlocal-net)"
    return "at every LR change" if mode == "every_change" else "off (SCALE_MOMENTUM: False)"


def _accumulation(schedule):
    """The `show` lines on gradient accumulation: one when ITER_SIZE > 1, none when it is 1."""
    size = schedule.iter_size
    if size == 1:
        return []
    return [f"  accumulation: ITER_SIZE {size} micro-batches per iteration (global batch = ranks x {size} x "
            "per-rank batch; iterations count updates)"]


def _show(args):
    schedule, notes = _load(args)
    spe = args.steps_per_epoch
    warmup = _dialect_warmup(schedule) or (f"{schedule.warm_up_method} warmup {schedule.warm_up_iters} its from "
                                           f"{_fmt(schedule.warm_up_factor)} x BASE_LR" if schedule.warm_up_iters
                                           else "no warmup")
    lines = [f"{args.config}: {schedule.lr_policy}, BASE_LR {_fmt(schedule.base_lr)}, MAX_ITER {schedule.max_iter}, "
             f"{warmup}", f"  parameters: {_parameter_rules(schedule)} (hvd_sched.keras.build_optimizer)",
             *_accumulation(schedule), *(f"  note: {note}" for note in notes), "", "phases"]
    header = ["phase", "start", "end", "lr at start", "lr at end-1"] + (["start epoch"] if spe else [])
    rows = [[name, start, "-" if end is None else end, _fmt(first), "-" if last is None else _fmt(last)]
            + ([f"{start / spe:g}"] if spe else []) for name, start, end, first, last in phases(schedule)]
    lines += _table(header, rows)
    stop = max(schedule.max_iter, schedule.hold_iter) + 1
    corrections = schedule.momentum_corrections(stop, limit=MAX_CORRECTIONS + 1)
    lines += ["", f"momentum corrections: {_count(corrections)}, {_correction_rule(schedule)}"]
    corrections = corrections[:MAX_CORRECTIONS]
    if corrections:
        rows = [[it, _fmt(schedule.lr_at(it - 1)), _fmt(schedule.lr_at(it)), _fmt(factor)]
                for it, factor in corrections]
        lines += _table(["iteration", "lr before", "lr after", "factor"], rows)
    print("\n".join(lines))


def _plot(args):
    schedule, notes = _load(args)
    from . import plot  # matplotlib is imported only here

    try:
        info = plot.plot_schedule(schedule, args.output, log_scale=args.log, width=args.width, height=args.height,
                                  dpi=args.dpi, steps_per_epoch=args.steps_per_epoch)
    except OSError as error:
        raise _BadInput([f"cannot write {args.output}: {error.strerror or error}"], about_config=False) from None
    except ValueError as error:
        raise _BadInput([str(error)], about_config=False) from None
    marks = [it for it, _ in info["corrections"]]
    shown = marks if len(marks) <= 10 else marks[:10] + ["..."]
    print(f"wrote {args.output} ({info['width']}x{info['height']} px): LR over iterations 0..{plot.plot_end(schedule)}"
          f"{', log scale' if args.log else ''}, warmup {info['warmup'] or 'none'}, "
          f"{len(marks)} momentum corrections marked {shown}")
    for note in notes:
        print(f"  note: {note}")


def _check(args):
    schedule, notes = _load(args, provisional_steps=True)
    steps = f", steps at {schedule.steps[1:]}" if schedule.lr_policy in _STEP_POLICIES else ""
    warmup = _dialect_warmup(schedule) or (f"{schedule.warm_up_method} warmup {schedule.warm_up_iters} its"
                                           if schedule.warm_up_iters else "no warmup")
    corrections = _count(schedule.momentum_corrections(max(schedule.max_iter, schedule.hold_iter) + 1,
                                                       limit=MAX_CORRECTIONS + 1))
    extra = f" ({'; '.join(notes)})" if notes else ""
    accumulation = (f", ITER_SIZE {schedule.iter_size} micro-batches per iteration" if schedule.iter_size > 1
                    else "")
    print(f"OK {args.config}: {schedule.lr_policy}, BASE_LR {_fmt(schedule.base_lr)}, {warmup}{steps}, "
          f"MAX_ITER {schedule.max_iter}{accumulation}, {corrections} momentum corrections{extra}")


def _parser():
    parser = argparse.ArgumentParser(prog="hvd-sched", description="Inspect a Detectron-style solver schedule "
                                     "(LR warmup, steps, momentum corrections) without TensorFlow.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{show,plot,check}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("config", metavar="CONFIG", help="Detectron-style YAML file (its SOLVER section)")
    common.add_argument("--world-size", type=int, metavar="N",
                        help="workers, for REFERENCE_WORLD_SIZE scaling (by N x ITER_SIZE)")
    common.add_argument("--steps-per-epoch", type=int, metavar="S",
                        help="iterations (optimizer updates) per epoch, for *_EPOCHS")
    common.add_argument("--dialect", choices=dialects.DIALECTS, default="detectron",
                        help="whose SOLVER keys and semantics the config has (default: detectron)")
    commands.add_parser("show", parents=[common], help="table of phases, LRs and momentum corrections")
    plot = commands.add_parser("plot", parents=[common], help="PNG of the LR over iterations")
    plot.add_argument("-o", "--output", required=True, metavar="PNG", help="the PNG file to write")
    plot.add_argument("--log", action="store_true", help="logarithmic LR axis")
    plot.add_argument("--width", type=int, default=1000, help="image width in pixels (default 1000)")
    plot.add_argument("--height", type=int, default=500, help="image height in pixels (default 500)")
    plot.add_argument("--dpi", type=float, default=100.0, help="dots per inch (default 100)")
    commands.add_parser("check", parents=[common], help="validate: exit 0 and a summary, or 2 and every problem")
    return parser


def main(argv=None):
    """Run `hvd-sched`.

    Args:
        argv: the arguments (default `sys.argv[1:]`).

    Returns:
        The exit status, `EXIT_OK` or `EXIT_BAD_INPUT` (argparse itself exits 2 on a usage error).
    """
    args = _parser().parse_args(argv)
    try:
        {"show": _show, "plot": _plot, "check": _check}[args.command](args)
    except BrokenPipeError:  # e.g. `hvd-sched show ... | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except _BadInput as bad:
        if len(bad.problems) == 1:
            problem = bad.problems[0]
            where = f"{args.config}: " if bad.about_config and args.config not in problem else ""
            print(f"hvd-sched {args.command}: error: {where}{problem}", file=sys.stderr)
        else:
            print(f"hvd-sched {args.command}: {args.config}: {len(bad.problems)} problems:", file=sys.stderr)
            for problem in bad.problems:
                print(f"  - {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
