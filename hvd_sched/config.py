"""Detectron `SOLVER` mappings and YAML files -> validated `Schedule` (layer 3: numpy, PyYAML on demand).

Units are converted here, once. The keys, hvd_sched's additions to them and the rules that convert them
are documented in `from_detectron`.
"""

import ast
import errno
import math
import os
import warnings
from collections.abc import Mapping

from . import dialects
from ._validation import MAX_INT, close_match_hint, float_list, int_list, integer, number
from .dialects import EPOCH_KEYS, SOLVER_KEYS
from .schedules import Schedule

__all__ = [
    "SOLVER_KEYS",
    "EPOCH_KEYS",
    "from_detectron",
    "load_solver",
    "snapshot_period",
    "linear_scaled_lr",
    "linear_scaled_lr_for_batch",
    "gradual_warmup_factor",
]


_ITERATION_KEYS = ("MAX_ITER", "STEP_SIZE", "STEPS", "WARM_UP_ITERS", "STEP_SIZES")
_LIST_KEYS = ("STEPS", "STEP_SIZES")
_POSITIVE_EPOCH_KEYS = ("MAX_EPOCHS", "STEP_SIZE_EPOCHS", "STEP_SIZES_EPOCHS")


def load_solver(path):
    """Read the SOLVER mapping of a Detectron YAML config (`yaml.safe_load`; other sections ignored).

    A file with a top-level `SOLVER` key yields that section. A file without one is read as a bare SOLVER
    mapping, unless it has other sections (`MODEL:`, `TRAIN:`, ...): then, as Detectron's merge would, no
    SOLVER key is set and every default applies (a `UserWarning` says so). String values are decoded with
    `ast.literal_eval` where that succeeds, as Detectron's `_decode_cfg_value` does (so `BASE_LR: 1e-3`, a
    string in YAML 1.1, is the number 0.001).

    Args:
        path: a `str` or `os.PathLike`.

    Returns:
        A new dict of SOLVER keys (validated by `from_detectron`, not here).

    Raises:
        FileNotFoundError: if the file does not exist (the message names it).
        ValueError: for a directory, malformed YAML (file, line and column named), YAML that PyYAML cannot load
            (an int of more than 4300 digits, nesting too deep; the file named) or a document that is not a mapping.

    Examples:
        >>> load_solver("examples/configs/e2e_faster_rcnn_R-50-FPN_1x.yaml")["STEPS"]
        [0, 60000, 80000]
    """
    import yaml  # PyYAML is needed only to read files.

    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as stream:
            document = yaml.safe_load(stream)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "Detectron config file not found", path) from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory, not a Detectron YAML config file") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error})") from error
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else path
        problem = getattr(error, "problem", None) or str(error)
        raise ValueError(f"malformed YAML in {where}: {problem}") from error
    except (ValueError, RecursionError) as error:  # PyYAML's int() of > 4300 digits; its recursive composer
        raise ValueError(f"cannot load the YAML in {path}: {type(error).__name__}: {error}") from error
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(document).__name__}")
    if "SOLVER" not in document and any(isinstance(value, Mapping) and key != "WARMUP"
                                         for key, value in document.items()):
        # A whole config (MODEL:, TRAIN:, ...) without a SOLVER section: Detectron's merge keeps every default.
        warnings.warn(f"{path}: no SOLVER section; the solver's defaults are used", UserWarning, stacklevel=2)
        return {}
    section = document["SOLVER"] if "SOLVER" in document else document
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ValueError(f"{path}: the SOLVER section must be a mapping, got {section!r}")
    return {key: _decode(value) for key, value in section.items()}


def snapshot_period(path):
    """Detectron's checkpoint period of a YAML config, in iterations: `int(TRAIN.SNAPSHOT_ITERS / NUM_GPUS)`.

    Detectron's `tools/train_net.py` (`detectron/utils/train.py`) saves every `CHECKPOINT_PERIOD =
    int(cfg.TRAIN.SNAPSHOT_ITERS / cfg.NUM_GPUS)` iterations (its NUM_GPUS default is 1); the same period is
    returned here, for `hvd_sched.keras.TrainingCheckpoint(period=...)`. detectron2's
    `SOLVER.CHECKPOINT_PERIOD` is not a Detectron SOLVER key: write `TRAIN: {SNAPSHOT_ITERS: N}` instead.

    Args:
        path: a Detectron YAML file (`str` or `os.PathLike`).

    Returns:
        The period (an int >= 1), or None where the file sets no `TRAIN.SNAPSHOT_ITERS` (then checkpoints are
        written at epoch ends, and at a stop signal, only).

    Raises:
        ValueError: SNAPSHOT_ITERS or NUM_GPUS is not an int >= 1, or their quotient is below 1 (values named);
            the file cannot be read as `load_solver` says.

    Examples:
        >>> print(snapshot_period("examples/configs/e2e_faster_rcnn_R-50-FPN_1x.yaml"))   # no TRAIN.SNAPSHOT_ITERS
        None
        >>> import pathlib, tempfile
        >>> folder = tempfile.TemporaryDirectory()
        >>> config = pathlib.Path(folder.name) / "solver.yaml"
        >>> _ = config.write_text("NUM_GPUS: 8\\nTRAIN: {SNAPSHOT_ITERS: 20000}\\nSOLVER: {BASE_LR: 0.02}\\n")
        >>> snapshot_period(config)
        2500
        >>> folder.cleanup()
    """
    import yaml

    with warnings.catch_warnings():  # only the file's own errors, worded once; the SOLVER keys are not read here
        warnings.simplefilter("ignore")
        load_solver(path)
    with open(os.fspath(path), encoding="utf-8") as stream:
        document = yaml.safe_load(stream) or {}
    train = document.get("TRAIN") if isinstance(document, Mapping) else None
    if not isinstance(train, Mapping) or "SNAPSHOT_ITERS" not in train:
        return None
    snapshot_iters = integer("TRAIN.SNAPSHOT_ITERS", _decode(train["SNAPSHOT_ITERS"]), low=1)
    num_gpus = integer("NUM_GPUS", _decode(document.get("NUM_GPUS", 1)), low=1)
    period = int(snapshot_iters / num_gpus)
    if period < 1:
        raise ValueError(f"TRAIN.SNAPSHOT_ITERS {snapshot_iters} / NUM_GPUS {num_gpus} is below one iteration")
    return period


def _decode(value):
    """Detectron's `_decode_cfg_value`: a string that is a Python literal becomes its value, any other stays.

    Besides Detectron's ValueError and SyntaxError, literal_eval raises TypeError for an unhashable set member or
    dict key (`{[]: 1}`) and RecursionError (or MemoryError) for a deeply nested one; those strings stay too, so
    the key's own check rejects them, naming the key.
    """
    if not isinstance(value, str):
        return value
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        return value


def _solver_section(solver):
    if isinstance(solver, (str, os.PathLike)):
        return load_solver(solver)
    if not isinstance(solver, Mapping):
        raise TypeError(f"solver must be a mapping of SOLVER keys or a YAML path, got {type(solver).__name__}")
    if "SOLVER" in solver:
        section = solver["SOLVER"]
        if not isinstance(section, Mapping):
            raise TypeError(f"the SOLVER section must be a mapping, got {section!r}")
        stray = sorted(key for key in solver if key in SOLVER_KEYS or key in EPOCH_KEYS)
        if stray:
            raise ValueError(f"SOLVER keys {stray} given next to a SOLVER section; put them inside it")
        return dict(section)
    return dict(solver)


def _check_keys(section):
    valid = list(SOLVER_KEYS) + list(EPOCH_KEYS)
    for key in section:
        if not isinstance(key, str):
            raise TypeError(f"SOLVER keys must be strings, got {key!r}")
        if key in SOLVER_KEYS or key in EPOCH_KEYS:
            continue
        if key.upper() in SOLVER_KEYS or key.upper() in EPOCH_KEYS:
            raise ValueError(f"SOLVER key {key!r} is not upper case; did you mean {key.upper()!r}? "
                             f"(Schedule.from_config takes the lower-case get_config() keys)")
        hint = dialects.foreign_key_hint(key, "detectron") or close_match_hint(key, valid)
        raise ValueError(f"unknown SOLVER key {key!r}{hint}")


def _convert_epochs(section, steps_per_epoch, notes):
    """Replace each epoch key by its iteration key, in place on the private copy; returns the converted keys."""
    converted = set()
    for epoch_key, iteration_key in EPOCH_KEYS.items():
        if epoch_key not in section:
            continue
        if iteration_key in section:
            raise ValueError(f"give either {iteration_key} or {epoch_key}, not both "
                             f"(got {iteration_key}={section[iteration_key]!r}, {epoch_key}={section[epoch_key]!r})")
        if steps_per_epoch is None:
            raise ValueError(f"steps_per_epoch is required when {epoch_key} is given")
        epochs = section.pop(epoch_key)
        low_open = epoch_key in _POSITIVE_EPOCH_KEYS
        if iteration_key in _LIST_KEYS:
            if isinstance(epochs, (str, bytes)) or not isinstance(epochs, (list, tuple)):
                raise TypeError(f"{epoch_key} must be a list, got {epochs!r}")
            values = [number(epoch_key, value, low=0, low_open=low_open) for value in epochs]
            if epoch_key == "STEPS_EPOCHS" and values and values[0] != 0:
                raise ValueError(f"STEPS_EPOCHS must start at 0, got {epochs!r}")
            section[iteration_key] = [_to_iterations(epoch_key, value, steps_per_epoch) for value in values]
        else:
            value = number(epoch_key, epochs, low=0, low_open=low_open)
            section[iteration_key] = _to_iterations(epoch_key, value, steps_per_epoch)
        notes.append(f"{iteration_key}={section[iteration_key]!r} was converted from {epoch_key}={epochs!r} "
                     f"with steps_per_epoch={steps_per_epoch}")
        converted.add(iteration_key)
    return converted


def _to_iterations(epoch_key, epochs, steps_per_epoch):
    """`int(round(epochs * steps_per_epoch))`, once the product is known to be at most 2**53 iterations."""
    iterations = epochs * steps_per_epoch
    if not iterations <= MAX_INT:  # also inf, which int(round()) would raise OverflowError for
        raise ValueError(f"{epoch_key} * steps_per_epoch must be <= {MAX_INT} iterations, got {epochs!r} * "
                         f"{steps_per_epoch} = {iterations!r}")
    return int(round(iterations))


def _scale_linearly(section, world_size, iter_size, from_epochs, notes):
    """Goyal et al.'s rule on the private copy `section`, by `world_size * iter_size / REFERENCE_WORLD_SIZE`
    (the global batch counts every micro-batch of an update); returns `(scale, REFERENCE_WORLD_SIZE)`."""
    reference = integer("reference_world_size", section.pop("REFERENCE_WORLD_SIZE", 0), low=0)
    if reference == 0:
        return 1.0, 0
    if world_size is None:
        raise ValueError(f"REFERENCE_WORLD_SIZE={reference} requires the world_size argument")
    # The int product first, so that 2 ranks x ITER_SIZE 2 give bit for bit the scale (and LRs) of 4 ranks.
    scale = world_size * iter_size / reference
    if scale == 1.0:
        return scale, reference
    # finite=False: Schedule rejects an infinite BASE_LR, as it does infinite LRS, with the scaling note.
    section["BASE_LR"] = _scaled_lr(section.get("BASE_LR", SOLVER_KEYS["BASE_LR"]), world_size, reference,
                                    iter_size=iter_size, finite=False)
    policy = section.get("LR_POLICY", SOLVER_KEYS["LR_POLICY"])
    if isinstance(policy, str) and policy == "steps_with_lrs" and "LRS" in section:
        section["LRS"] = [lr * scale for lr in float_list("lrs", section["LRS"])]
    for key in _ITERATION_KEYS:
        if key in from_epochs:
            continue
        value = section.get(key, SOLVER_KEYS[key])
        if key in _LIST_KEYS:
            section[key] = [int(round(item / scale)) for item in int_list(key.lower(), value)]
        else:
            section[key] = int(round(integer(key.lower(), value, low=0) / scale))
    if iter_size == 1:
        notes.append(f"linear scaling by world_size / REFERENCE_WORLD_SIZE = {world_size} / {reference}")
    else:
        notes.append(f"linear scaling by world_size x ITER_SIZE / REFERENCE_WORLD_SIZE = {world_size} x {iter_size} "
                     f"/ {reference}")
    return scale, reference


def from_detectron(solver, *, steps_per_epoch=None, world_size=None, dialect="detectron"):
    """Build a `Schedule` from Detectron's SOLVER keys (or those of another Detectron-family repository).

    The keys are Detectron's (`detectron/core/config.py`), upper case; a YAML file is read by `load_solver`
    (other sections ignored; a YAML with no `SOLVER` section uses the defaults, and a `UserWarning` says so).
    hvd_sched adds these keys, in the `'detectron'` dialect only:

    - `SCALE_MOMENTUM_MODE`, `STEP_SIZES`, `POWER`, `LR_FACTOR`: see `Schedule`.
    - `ITER_SIZE` (int >= 1, default 1; Caffe's `iter_size`): micro-batches per iteration. Each iteration, one
      optimizer update, averages the gradients of ITER_SIZE micro-batches on every rank (Horovod's
      `backward_passes_per_step`, Keras 3's `gradient_accumulation_steps`), so the global batch is `world_size *
      ITER_SIZE * per-rank batch`. Every iteration-valued key (MAX_ITER, STEPS, WARM_UP_ITERS, ...) still counts
      updates, and `steps_per_epoch` is updates per epoch (micro-batches per epoch / ITER_SIZE). It is carried into
      the `Schedule` unchanged; only the two rules below count it.
    - Epoch units for Keras users: `MAX_EPOCHS`, `STEP_SIZE_EPOCHS`, `STEPS_EPOCHS`, `WARM_UP_EPOCHS`,
      `STEP_SIZES_EPOCHS`, converted with the `steps_per_epoch` argument to `int(round(epochs *
      steps_per_epoch))` iterations (Python's round: halves go to even). Giving a key in both units is an error.
    - Linear scaling (Goyal et al., arXiv:1706.02677; detectron2's `DefaultTrainer.auto_scale_workers`):
      `REFERENCE_WORLD_SIZE` (0, the default, turns it off) is the world size the config was written for; with
      the `world_size` argument, the scale counts the global batch: `scale = world_size * ITER_SIZE /
      REFERENCE_WORLD_SIZE` (ITER_SIZE 2 on 2 ranks gives exactly the schedule of 4 ranks with ITER_SIZE 1). BASE_LR
      and the absolute LRS of `steps_with_lrs` are multiplied by `scale`, and the iteration-valued keys given in
      iterations (MAX_ITER, STEP_SIZE, STEPS, WARM_UP_ITERS, STEP_SIZES, defaults included) become
      `int(round(value / scale))`. Epoch-valued keys are not divided: `steps_per_epoch` already reflects the
      global batch.
    - `WARM_UP_FACTOR: horovod`: Horovod's gradual warmup from `lr / size` to `lr`, with the size counting the
      micro-batches of an update: `(REFERENCE_WORLD_SIZE or 1) / (world_size * ITER_SIZE)`, i.e. `1 / scale`
      when REFERENCE_WORLD_SIZE is set.

    The world size is always an argument, never looked up. Lower-case keys (`get_config()` dicts) are rejected:
    `Schedule.from_config` is for those. With `dialect='large_scale_vrd'` or `'video_nonlocal'` the YAMLs of
    those repositories are read unchanged (their keys, defaults and semantics: docs/explanation/dialects.md).

    Args:
        solver: a mapping of upper-case SOLVER keys, a mapping with a `SOLVER` section (other sections
            ignored), or the path of a Detectron YAML config.
        steps_per_epoch: iterations (optimizer updates) per epoch (int > 0), required by the `*_EPOCHS` keys.
            With ITER_SIZE > 1 that is the micro-batches per epoch divided by ITER_SIZE.
        world_size: the number of workers (int > 0), required by `REFERENCE_WORLD_SIZE > 0` and
            `WARM_UP_FACTOR: horovod`; otherwise unused. Both rules count `world_size * ITER_SIZE`.
        dialect: `'detectron'` (default), `'large_scale_vrd'` or `'video_nonlocal'`: whose keys, defaults
            and LR / warmup / correction semantics the config has (`hvd_sched.dialects`, docs/explanation/dialects.md).
            The hvd_sched additions (epoch keys, REFERENCE_WORLD_SIZE, ITER_SIZE, ...) belong to `'detectron'`.

    Returns:
        A validated `Schedule` in iterations.

    Raises:
        ValueError: for unknown keys (the closest valid key suggested; a key of another dialect names that
            dialect), invalid values (key and value named), missing `steps_per_epoch` / `world_size`, or a
            malformed YAML file (file and line named).
        TypeError: for values of the wrong type.
        FileNotFoundError: for a missing YAML file.

    Examples:
        >>> schedule = from_detectron({"SOLVER": {"BASE_LR": 0.02, "LR_POLICY": "steps_with_decay",
        ...                                       "STEPS_EPOCHS": [0, 8, 11], "MAX_EPOCHS": 12}},
        ...                           steps_per_epoch=1000)
        >>> schedule.boundaries()
        [0, 500, 8000, 11000, 12000]
        >>> from_detectron({"BASE_LR": 0.1, "REFERENCE_WORLD_SIZE": 8, "MAX_ITER": 1000}, world_size=16).lr_at(700)
        0.20000000298023224
        >>> from_detectron("examples/configs/digits_warmup_steps.yaml", steps_per_epoch=22, world_size=2).base_lr
        0.1
        >>> from_detectron({"WARM_UP_FACTOR": 1.5})
        Traceback (most recent call last):
        ...
        ValueError: WARM_UP_FACTOR must be in (0, 1], got 1.5
        >>> from_detectron({"WARMUP_ITERS": 100})
        Traceback (most recent call last):
        ...
        ValueError: unknown SOLVER key 'WARMUP_ITERS'; did you mean 'WARM_UP_ITERS'?
        >>> from_detectron({"NUM_ITERATIONS": 10})
        Traceback (most recent call last):
        ...
        ValueError: unknown SOLVER key 'NUM_ITERATIONS' (a Large-Scale-VRD key: pass dialect='large_scale_vrd')
    """
    if not isinstance(dialect, str) or dialect not in dialects.DIALECTS:
        raise ValueError(f"dialect must be one of {list(dialects.DIALECTS)}, got {dialect!r}")
    if steps_per_epoch is not None:
        steps_per_epoch = integer("steps_per_epoch", steps_per_epoch, low=1, label="steps_per_epoch")
    if world_size is not None:
        world_size = integer("world_size", world_size, low=1, label="world_size")
    section = _solver_section(solver)
    if dialect != "detectron":
        arguments, _ = dialects.schedule_arguments(section, dialect)
        try:
            return Schedule(**arguments)
        except (ValueError, TypeError) as error:
            raise type(error)(dialects.rename(str(error), dialect)) from error
    _check_keys(section)
    # Checked here, at the boundary, because the scaling rules below read it; Schedule keeps it unchanged.
    iter_size = integer("iter_size", section.get("ITER_SIZE", SOLVER_KEYS["ITER_SIZE"]), low=1)
    notes = []
    from_epochs = _convert_epochs(section, steps_per_epoch, notes)
    scale, reference = _scale_linearly(section, world_size, iter_size, from_epochs, notes)
    # isinstance first: an array compared with == 'horovod' is an array, whose truth value numpy refuses.
    warm_up_factor = section.get("WARM_UP_FACTOR")
    if isinstance(warm_up_factor, str) and warm_up_factor == "horovod":
        if world_size is None:
            raise ValueError("WARM_UP_FACTOR 'horovod' requires the world_size argument")
        section["WARM_UP_FACTOR"] = gradual_warmup_factor(world_size, reference or 1, iter_size=iter_size)
        size = f"world_size {world_size}" if iter_size == 1 else f"(world_size {world_size} x ITER_SIZE {iter_size})"
        notes.append(f"WARM_UP_FACTOR 'horovod' = {reference or 1} / {size}")
    elif isinstance(warm_up_factor, str):
        raise ValueError(f"WARM_UP_FACTOR must be a number or 'horovod', got {warm_up_factor!r}")
    arguments = {key.lower(): value for key, value in section.items()}
    try:
        return Schedule(**arguments)
    except ValueError as error:
        if not notes:
            raise
        raise ValueError(f"{error} ({'; '.join(notes)})") from error


_WORLD_SIZES = ("world_size", "reference_world_size")


def _scaled_lr(base_lr, size, reference, names=_WORLD_SIZES, *, iter_size=1, finite=True):
    """`base_lr * (size * iter_size / reference)` with validated arguments (`names`: those of `size` and
    `reference`; `iter_size` is named ITER_SIZE, as the key).

    `finite`: reject a product beyond float64; else return it (inf), for Schedule to reject with the notes.
    """
    base_lr = number("base_lr", base_lr, low=0, low_open=True)
    size = integer(names[0], size, low=1, label=names[0])
    reference = integer(names[1], reference, low=1, label=names[1])
    iter_size = integer("iter_size", iter_size, low=1)
    lr = base_lr * (size * iter_size / reference)  # the int product first: exact, whatever the split
    if finite and not math.isfinite(lr):
        times = "" if iter_size == 1 else " x ITER_SIZE"
        got = "" if iter_size == 1 else f" x {iter_size}"
        raise ValueError(f"BASE_LR * ({names[0]}{times} / {names[1]}) must be finite, got {base_lr!r} * ({size}{got} "
                         f"/ {reference}) = {lr!r}")
    return lr


def linear_scaled_lr(base_lr, world_size, reference_world_size=1, *, iter_size=1):
    """The linear scaling rule (Goyal et al.): `base_lr * (world_size * iter_size / reference_world_size)`.

    The operation order of detectron2's `auto_scale_workers` (`BASE_LR * scale`).

    Args:
        base_lr: the LR the config was written for (> 0).
        world_size: the number of workers (int >= 1).
        reference_world_size: the number of workers the config was written for (int >= 1).
        iter_size: ITER_SIZE, micro-batches per update on each worker (int >= 1; the global batch counts them).

    Returns:
        The scaled LR, a float.

    Raises:
        ValueError: for a base_lr <= 0, world sizes < 1 or > 2**53, an iter_size < 1, or a product beyond float64
            (names it).
        TypeError: for arguments of the wrong type.

    Examples:
        A config written for 8 workers at 0.02, run on 32 workers, or on 16 workers that accumulate 2
        micro-batches per update:

        >>> linear_scaled_lr(0.02, 32, 8)
        0.08
        >>> linear_scaled_lr(0.02, 16, 8, iter_size=2)
        0.08
    """
    return _scaled_lr(base_lr, world_size, reference_world_size, iter_size=iter_size)


def linear_scaled_lr_for_batch(base_lr, *, global_batch, reference_batch):
    """The linear scaling rule by batch size: `base_lr * (global_batch / reference_batch)`.

    Args:
        base_lr: the LR the config was written for (> 0).
        global_batch: the global batch of one update (int >= 1), counting every micro-batch: `world_size *
            ITER_SIZE * per-rank batch`.
        reference_batch: the global batch the config was written for (int >= 1).

    Returns:
        The scaled LR, a float.

    Raises:
        ValueError: for a base_lr <= 0, batches < 1 or > 2**53, or a product beyond float64 (names it).
        TypeError: for arguments of the wrong type.

    Examples:
        Goyal et al.'s `lr = 0.1 * batch / 256`:

        >>> linear_scaled_lr_for_batch(0.1, global_batch=8192, reference_batch=256)
        3.2
    """
    return _scaled_lr(base_lr, global_batch, reference_batch, ("global_batch", "reference_batch"))


def gradual_warmup_factor(world_size, reference_world_size=1, *, iter_size=1):
    """The WARM_UP_FACTOR of Horovod's gradual warmup (`lr / size` -> `lr`): `1 / scale`.

    Horovod's `LearningRateWarmupCallback` multiplies the LR by `1 / size * (epoch * (size - 1) / warmup + 1)`,
    which is the linear warmup `F * (1 - alpha) + alpha` with `F = 1 / size`: Horovod's warmup "from lr / size".
    With a reference world size, `F = reference_world_size / world_size` (a factor above 1 is rejected when a
    Schedule is built). With `iter_size` micro-batches per update (ITER_SIZE), the size counts them:
    `F = reference_world_size / (world_size * iter_size)`. `WARM_UP_FACTOR: horovod` in a config is this value
    (`from_detectron`).

    Args:
        world_size: the number of workers (int >= 1).
        reference_world_size: the number of workers the config was written for (int >= 1).
        iter_size: ITER_SIZE, micro-batches per update on each worker (int >= 1).

    Returns:
        The WARM_UP_FACTOR, a float in (0, 1] where `world_size * iter_size >= reference_world_size`.

    Raises:
        ValueError: for world sizes < 1 or > 2**53, or an iter_size < 1 (names it).
        TypeError: for arguments of the wrong type.

    Examples:
        >>> gradual_warmup_factor(8)
        0.125
        >>> gradual_warmup_factor(2, iter_size=2)
        0.25
    """
    world_size = integer("world_size", world_size, low=1, label="world_size")
    reference_world_size = integer("reference_world_size", reference_world_size, low=1,
                                    label="reference_world_size")
    iter_size = integer("iter_size", iter_size, low=1)
    return reference_world_size / (world_size * iter_size)
