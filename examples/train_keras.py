"""Train a small Keras model on N Horovod ranks with Detectron's solver schedule (hvd_sched).

A complete data-parallel script as users write it::

    horovodrun -np 2 -H localhost:2 --gloo python examples/train_keras.py \
        --config examples/configs/digits_warmup_steps.yaml --epochs 8 --out runs/demo

What it does, in order: ``hvd.init()``; pin one GPU per local rank (if any); load a dataset (scikit-learn's
shipped ``load_digits`` by default, generated data with ``--synthetic``, MNIST/CIFAR-10 via
``tf.keras.datasets`` with network) and give each rank an equal, disjoint shard; build the schedule from a
Detectron-style YAML (``--config``) or from flags, with the LR scaled linearly by ``hvd.size()``
(``REFERENCE_WORLD_SIZE``); train with ``hvd_sched.keras.DistributedOptimizer(build_optimizer(config, model))``
(Horovod's own DistributedOptimizer on Keras 2, hvd_sched's Horovod-collective one on Keras 3; Detectron's
whole solver from the config: MOMENTUM, NESTEROV, WEIGHT_DECAY coupled into the gradient, biases at 2x LR without
decay, norm scales at WEIGHT_DECAY_GN; the rules are printed) and
the broadcast and metric-average callbacks of ``horovod_callbacks()``; print the LR of every epoch; write TensorBoard logs and
checkpoints on rank 0; finally print the validation accuracy measured on every rank.

Checkpoints (``OUT/ckpt``): ``hvd_sched.keras.TrainingCheckpoint`` writes model + optimizer on rank 0 after each
epoch, every ``--checkpoint-period`` iterations, and when the job is asked to stop (SIGTERM from horovodrun,
mpirun, Slurm or Kubernetes, Ctrl-C, Slurm's ``--signal=USR1``): the ranks agree on one iteration, rank 0 saves,
and every rank exits with status 128 + the signal's number (143 for SIGTERM). Each save is atomic (a temporary
folder renamed into place, then the ``latest`` pointer replaced), so a process killed mid-save never leaves a
torn checkpoint as the latest. ``--resume`` calls ``restore_latest`` on every rank: each reads ``OUT/ckpt`` and
rank 0's state is then broadcast, so every rank starts the first step from the same weights, optimizer slots and
iteration count (``OUT`` on a filesystem the ranks can read: always true on one machine; across machines a shared
filesystem, or rank 0's copy is broadcast to ranks that cannot read it); ``resume_plan`` then runs the rest of a
checkpoint's epoch first, with the data stream skipped by exactly the micro-batches already used, so the resumed
run ends with the weights of the run never stopped.
"""

import argparse
import importlib.util
import json
import os
import sys
import time

import hvd_sched._compat  # noqa: F401  (before Horovod: keras -> tf_keras on TF >= 2.16, clear stack errors)

import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

import hvd_sched
import hvd_sched.keras
from hvd_sched.keras import (TrainingCheckpoint, build_optimizer, describe_optimizer, horovod_callbacks,
                             restore_latest, resume_plan)

__all__ = ["load_dataset", "shard", "make_dataset", "build_model", "build_schedule", "EpochReport", "main"]

DATASETS = ("digits", "mnist", "cifar10")


def parse_args(argv=None):
    """The command-line flags (``--help`` lists them)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="Detectron-style YAML with a SOLVER section (else the schedule flags)")
    parser.add_argument("--epochs", type=int, help="epochs to train (default: the schedule's MAX_ITER)")
    parser.add_argument("--batch-size", type=int, default=32, help="batch size per rank (default 32): with "
                        "--iter-size K, each rank's micro-batch")
    parser.add_argument("--iter-size", type=int, help="micro-batches per iteration (gradient accumulation: global "
                        "batch = ranks x K x --batch-size; default: the config's ITER_SIZE, else 1)")
    parser.add_argument("--dataset", choices=DATASETS, default="digits")
    parser.add_argument("--synthetic", action="store_true", help="generated data instead of --dataset")
    parser.add_argument("--out", default="runs/train", help="checkpoints (OUT/ckpt) and TensorBoard (OUT/tb)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in OUT (none: "
                        "from scratch), at its iteration, inside an epoch too")
    parser.add_argument("--checkpoint-period", type=int, help="also checkpoint every N iterations (default: the "
                        "config's TRAIN.SNAPSHOT_ITERS / NUM_GPUS, as Detectron; else epoch ends only)")
    parser.add_argument("--stop-signals", nargs="*", default=["SIGTERM", "SIGINT", "SIGUSR1"],
                        help="signals that stop every rank at one iteration with a checkpoint (default: SIGTERM "
                        "SIGINT SIGUSR1); the process then exits with 128 + the signal's number")
    parser.add_argument("--peer-timeout", type=float, default=hvd_sched.keras.checkpoint.DEFAULT_PEER_TIMEOUT,
                        help="seconds without a heartbeat from another rank (a dead, frozen or cut-off node) after "
                        "which every rank that can still run exits with status 75, naming it, to be requeued "
                        "(default %(default)g; 0: no heartbeat)")
    parser.add_argument("--seed", type=int, default=0)
    schedule = parser.add_argument_group("schedule when there is no --config (epoch units, LR for 1 rank)")
    schedule.add_argument("--base-lr", type=float, default=0.05, help="BASE_LR for one rank, scaled by size")
    schedule.add_argument("--lr-policy", choices=("steps_with_decay", "cosine_decay"), default="steps_with_decay")
    schedule.add_argument("--steps-epochs", type=float, nargs="*", default=[0, 5, 7], help="STEPS_EPOCHS")
    schedule.add_argument("--gamma", type=float, default=0.1)
    schedule.add_argument("--warmup-epochs", type=float, default=1.0)
    schedule.add_argument("--warmup-method", choices=("linear", "constant"), default="linear")
    schedule.add_argument("--warmup-factor", type=float, default=0.1)
    schedule.add_argument("--momentum", type=float, default=0.9)
    schedule.add_argument("--weight-decay", type=float, default=1e-4)
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------- data


def load_dataset(name, synthetic=False, seed=0):
    """The whole dataset, identical on every rank (sharding comes after).

    Args:
        name: ``'digits'`` (scikit-learn's shipped copy, no network), ``'mnist'`` or ``'cifar10'`` (downloaded
            once per machine by ``tf.keras.datasets`` into ``~/.keras/datasets``).
        synthetic: generated data instead (ten Gaussian clusters in 64 dimensions, like digits).
        seed: the seed of the generated data.

    Returns:
        ``(x_train, y_train, x_val, y_val)``: float32 inputs scaled to [0, 1] and int32 labels.
    """
    if synthetic:
        # Ten Gaussian clusters in 64 dimensions: learnable, like digits, and needs no file.
        rng = np.random.default_rng(seed)
        centers = rng.normal(size=(10, 64)).astype(np.float32)
        y = rng.integers(0, 10, size=2400).astype(np.int32)
        x = centers[y] + 0.8 * rng.normal(size=(y.size, 64)).astype(np.float32)
        return x[:2000], y[:2000], x[2000:], y[2000:]
    if name == "digits":
        from sklearn.datasets import load_digits  # shipped with scikit-learn: no download

        digits = load_digits()
        x, y = (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int32)
        order = np.random.default_rng(1234).permutation(y.size)  # a fixed split, independent of --seed
        val = order[:360]
        train = order[360:]
        return x[train], y[train], x[val], y[val]
    loader = {"mnist": tf.keras.datasets.mnist, "cifar10": tf.keras.datasets.cifar10}[name]
    # One download per machine: local rank 0 fetches into ~/.keras/datasets, the others then read the cache.
    if hvd.local_rank() == 0:
        loader.load_data()
    hvd.allreduce(tf.constant(0.0), name="dataset_downloaded")
    (x_train, y_train), (x_val, y_val) = loader.load_data()
    if x_train.ndim == 3:
        x_train, x_val = x_train[..., None], x_val[..., None]
    scale = np.float32(1.0 / 255.0)
    return (x_train.astype(np.float32) * scale, y_train.reshape(-1).astype(np.int32),
            x_val.astype(np.float32) * scale, y_val.reshape(-1).astype(np.int32))


def shard(x, y, rank, size):
    """This rank's contiguous slice of ``(x, y)``.

    Every rank gets ``len(y) // size`` samples (the remainder is dropped), so every rank runs the same number of
    steps and Horovod's allreduce never waits for a rank that has finished.

    Args:
        x: inputs, indexed along the first axis.
        y: labels, as long as ``x``.
        rank: ``hvd.rank()``.
        size: ``hvd.size()``.

    Returns:
        ``(x_shard, y_shard)``.
    """
    per_rank = len(y) // size
    part = slice(rank * per_rank, (rank + 1) * per_rank)
    return x[part], y[part]


def make_dataset(x, y, batch_size, *, seed, training, skip_batches=0):
    """A ``tf.data`` pipeline over in-memory arrays (for files, add ``.prefetch(tf.data.AUTOTUNE)``).

    Args:
        x: inputs.
        y: labels.
        batch_size: the batch size of this rank.
        seed: the shuffle seed (training only).
        training: an endless stream of shuffled full batches; else one pass in order.
        skip_batches: training batches to skip, so a resumed run sees exactly the batches an uninterrupted one
            would (the micro-batches consumed before: ``FitPart.skip_batches``). ``Dataset.skip`` produces the
            skipped batches (cheap for in-memory arrays; for a pipeline that decodes files, skip on the file or
            index level before the decoding ``map``).

    Returns:
        A ``tf.data.Dataset`` of ``(x, y)`` batches.
    """
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    if not training:
        return dataset.batch(batch_size)
    dataset = dataset.shuffle(len(y), seed=seed, reshuffle_each_iteration=True).repeat()
    return dataset.batch(batch_size, drop_remainder=True).skip(skip_batches)


# ---------------------------------------------------------------------------------------------- model


def build_model(input_shape, num_classes):
    """An MLP for flat inputs, a small CNN for images, softmax outputs; no regularizers (the weight decay is the
    optimizer's, from the config: ``build_optimizer``).

    Args:
        input_shape: one sample's shape, e.g. ``(64,)`` or ``(28, 28, 1)``.
        num_classes: the number of outputs.

    Returns:
        An uncompiled, built ``tf.keras.Sequential``.
    """
    layers = tf.keras.layers
    if len(input_shape) == 1:
        body = [layers.Dense(64, activation="relu")]
    else:
        body = [layers.Conv2D(16, 3, activation="relu"), layers.MaxPooling2D(),
                layers.Conv2D(32, 3, activation="relu"), layers.GlobalAveragePooling2D()]
    return tf.keras.Sequential([tf.keras.Input(input_shape), *body, layers.Dense(num_classes, activation="softmax")])


def iter_size_of(args):
    """Micro-batches per iteration: ``--iter-size``, else the config's ITER_SIZE, else 1."""
    if args.iter_size is not None:
        return args.iter_size
    if args.config:
        return hvd_sched.load_solver(args.config).get("ITER_SIZE", 1)
    return 1


def build_schedule(args, steps_per_epoch, world_size):
    """The schedule from ``--config`` (a Detectron YAML) or from the schedule flags, in iterations.

    Args:
        args: the parsed flags (``--iter-size`` replaces the config's ITER_SIZE).
        steps_per_epoch: iterations (updates) per epoch, for the ``*_EPOCHS`` keys.
        world_size: ``hvd.size()``, for REFERENCE_WORLD_SIZE's linear scaling (the flags say 1), which counts
            world_size x ITER_SIZE.

    Returns:
        An ``hvd_sched.Schedule``.

    Raises:
        ValueError, TypeError, FileNotFoundError: from ``hvd_sched.from_detectron`` for a bad config.
    """
    if args.config:
        solver = dict(hvd_sched.load_solver(args.config))
    else:
        solver = {"SOLVER": {
            "BASE_LR": args.base_lr, "REFERENCE_WORLD_SIZE": 1, "LR_POLICY": args.lr_policy,
            "GAMMA": args.gamma, "MAX_EPOCHS": args.epochs or 8, "WARM_UP_EPOCHS": args.warmup_epochs,
            "WARM_UP_METHOD": args.warmup_method, "WARM_UP_FACTOR": args.warmup_factor,
            "MOMENTUM": args.momentum, "WEIGHT_DECAY": args.weight_decay}}
        if args.lr_policy == "steps_with_decay":
            solver["SOLVER"]["STEPS_EPOCHS"] = args.steps_epochs
        solver = solver["SOLVER"]
    if args.iter_size is not None:
        solver["ITER_SIZE"] = args.iter_size
    return hvd_sched.from_detectron(solver, steps_per_epoch=steps_per_epoch, world_size=world_size)


# ---------------------------------------------------------------------------------------------- callbacks


class EpochReport(tf.keras.callbacks.Callback):
    """Rank 0: one line per epoch with the LR range the schedule gave that epoch and the averaged metrics."""

    def __init__(self, schedule, steps_per_epoch, epochs):
        super().__init__()
        self.schedule, self.steps_per_epoch, self.epochs = schedule, steps_per_epoch, epochs
        self.history = []

    def on_epoch_end(self, epoch, logs=None):
        first = epoch * self.steps_per_epoch
        lrs = self.schedule.lr_at(np.arange(first, first + self.steps_per_epoch))
        lr = f"{lrs[0]:.4g}" if lrs[0] == lrs[-1] else f"{lrs[0]:.4g} -> {lrs[-1]:.4g}"
        # Keras 3 hands the logs sorted by name: print loss first and validation last on every Keras.
        order = lambda k: (k.startswith("val_"), k.removeprefix("val_") != "loss", k)
        metrics = "  ".join(f"{k} {(logs or {})[k]:.4f}" for k in sorted(logs or {}, key=order)
                            if k != "learning_rate")
        print(f"epoch {epoch + 1}/{self.epochs}  lr {lr}  {metrics}", flush=True)
        self.history.append({"epoch": epoch + 1, "lr_first": float(lrs[0]), "lr_last": float(lrs[-1]),
                             **{k: float(v) for k, v in (logs or {}).items()}})


# ---------------------------------------------------------------------------------------------- main


def main(argv=None):
    """Train, checkpoint, report; returns the exit status. Run it under ``horovodrun`` (or alone, as 1 rank)."""
    args = parse_args(argv)
    period = args.checkpoint_period
    if period is None and args.config:
        period = hvd_sched.snapshot_period(args.config)
    # Rank 0 writes; every rank handles the stop signals, from here to the end: one that comes while the job sets
    # up stops the first fit at its first iteration, with a checkpoint; one after the last fit is answered
    # by the end of the job (its training is complete and saved). A stop raises TrainingInterrupted: the process
    # exits with status 128 + the signal. A rank that stops answering (its node dead, frozen, cut off) makes the
    # others exit with status 75 (hvd_sched.keras.PEER_LOST_STATUS) after --peer-timeout seconds.
    checkpoint = TrainingCheckpoint(os.path.join(args.out, "ckpt"), period=period,
                                    stop_signals=tuple(args.stop_signals), peer_timeout=args.peer_timeout or None)
    with checkpoint.handling_signals():
        return _run(args, checkpoint)


def _run(args, checkpoint):
    """``main`` once the stop signals are handled."""
    hvd.init()
    # mpirun/srun started N processes that Horovod did not join? Stop here, on every process (README, "Launching").
    hvd_sched.keras.check_launcher()
    rank, size = hvd.rank(), hvd.size()
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    # The same seed on every rank: identical initial weights (Horovod's broadcast only happens after batch 1).
    tf.keras.utils.set_random_seed(args.seed)
    tf.config.experimental.enable_op_determinism()

    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
    x_train, y_train, x_val, y_val = load_dataset(args.dataset, args.synthetic, args.seed)
    x_shard, y_shard = shard(x_train, y_train, rank, size)
    x_val_shard, y_val_shard = shard(x_val, y_val, rank, size)
    iter_size = iter_size_of(args)
    if isinstance(iter_size, bool) or not isinstance(iter_size, int) or iter_size < 1:
        raise SystemExit(f"--iter-size / ITER_SIZE must be an int >= 1, got {iter_size!r}")
    # An iteration is one update of iter_size micro-batches; an epoch ends on an update (the rest is dropped).
    steps_per_epoch = len(y_shard) // (args.batch_size * iter_size)
    if steps_per_epoch < 1:
        raise SystemExit(f"--batch-size {args.batch_size} x ITER_SIZE {iter_size} is larger than this rank's "
                         f"{len(y_shard)} samples")
    schedule = build_schedule(args, steps_per_epoch, size)
    epochs = args.epochs or -(-schedule.max_iter // steps_per_epoch)
    if rank == 0:
        source = args.config or "flags"
        per_epoch = (f"{steps_per_epoch} steps per epoch" if iter_size == 1 else
                     f"{steps_per_epoch} iterations of {iter_size} micro-batches per epoch")
        print(f"hvd_sched example: {size} ranks, {len(y_shard)} samples and {per_epoch} per rank (global batch "
              f"{args.batch_size * iter_size * size}); schedule from {source}: {schedule.lr_policy}, "
              f"base LR {schedule.base_lr:.4g}, warmup {schedule.warm_up_iters} its, MAX_ITER {schedule.max_iter}, "
              f"corrections at {[it for it, _ in schedule.momentum_corrections(epochs * steps_per_epoch)]}",
              flush=True)
        if args.config:
            print(f"  the same schedule: hvd-sched show {args.config} --world-size {size} "
                  f"--steps-per-epoch {steps_per_epoch}", flush=True)

    model = build_model(x_train.shape[1:], int(y_train.max()) + 1)
    solver = build_optimizer(schedule, model)  # momentum, Nesterov and the weight decays: the config's, once
    if rank == 0:
        print(f"  solver: momentum {schedule.momentum:g}, {describe_optimizer(solver, model)}", flush=True)
    optimizer = hvd_sched.keras.DistributedOptimizer(solver)  # Keras 2: Horovod's own; Keras 3: hvd_sched's
    # jit_compile=False: Horovod's collectives have no XLA kernels, so the train step itself stays un-compiled
    # (Keras 3 would compile it on a GPU by default); Keras 2's per-variable XLA optimizer update stays on.
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  jit_compile=False)

    checkpoint_dir = checkpoint.directory
    meta = None
    if args.resume:
        meta = restore_latest(checkpoint_dir, model)  # every rank reads; rank 0's state is broadcast
        if meta is not None:
            at_end = meta.get("step") is None or meta["step"] == meta.get("steps_per_epoch")
            where = (f"at epoch {meta['epoch'] + 1}" if at_end else
                     f"in epoch {meta['epoch']}, step {meta['step']} of {meta['steps_per_epoch']}")
            print(f"rank {rank}: resumed from {meta['path']} {where} "
                  f"(iteration {hvd_sched.keras.iteration_count(optimizer)})", flush=True)
        elif rank == 0:
            print(f"--resume: no checkpoint in {checkpoint_dir}; starting from scratch", flush=True)
    # The rest of a checkpoint's epoch (if it was saved inside one), then the next epochs.
    parts = resume_plan(meta, steps_per_epoch, epochs, micro_batches=iter_size)

    report = EpochReport(schedule, steps_per_epoch, epochs)
    callbacks = horovod_callbacks(checkpoint=checkpoint)
    if rank == 0:
        # Our own progress bar ahead of the report, so Keras' epoch line is complete before ours is printed.
        progbar = (tf.keras.callbacks.ProgbarLogger(count_mode="steps") if hvd_sched.keras.KERAS_MAJOR == 2
                   else tf.keras.callbacks.ProgbarLogger())  # Keras 3 counts steps without being asked
        callbacks += [progbar, report]
        if importlib.util.find_spec("tensorboard") is not None:
            callbacks.append(tf.keras.callbacks.TensorBoard(os.path.join(args.out, "tb"), write_graph=False,
                                                            profile_batch=0))
        else:  # TensorFlow >= 2.21 no longer depends on TensorBoard; Keras' callback would fail at the first batch
            print("  TensorBoard is not installed: no logs in OUT/tb (pip install tensorboard)", flush=True)
    started = time.time()
    for part in parts:  # a stop signal raises hvd_sched.keras.TrainingInterrupted: exit status 128 + signal
        model.fit(make_dataset(x_shard, y_shard, args.batch_size, seed=args.seed + rank, training=True,
                               skip_batches=part.skip_batches),
                  steps_per_epoch=part.steps_per_epoch, epochs=part.epochs, initial_epoch=part.initial_epoch,
                  validation_data=make_dataset(x_val_shard, y_val_shard, args.batch_size, seed=0, training=False),
                  callbacks=callbacks, verbose=1 if rank == 0 else 0)

    # Every rank evaluates the whole validation set: equal numbers show the ranks hold the same weights.
    _, accuracy = model.evaluate(x_val, y_val, batch_size=256, verbose=0)
    print(f"rank {rank}: final val accuracy {accuracy:.4f} ({len(y_val)} samples, "
          f"iteration {hvd_sched.keras.iteration_count(optimizer)})", flush=True)
    if rank == 0:
        summary = {"world_size": size, "steps_per_epoch": steps_per_epoch, "epochs": epochs,
                   "initial_epoch": parts[0].initial_epoch if parts else epochs, "final_val_accuracy": float(accuracy),
                   "iter_size": iter_size, "iterations": hvd_sched.keras.iteration_count(optimizer),
                   "train_seconds": time.time() - started,
                   "epoch_log": report.history, "schedule": schedule.get_config()}
        with open(os.path.join(args.out, "summary.json"), "w") as stream:
            json.dump(summary, stream, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
