"""Benchmark: a small "Accurate, Large Minibatch SGD" Table 1 (Goyal et al., arXiv:1706.02677) on CPU.

A small CNN on scikit-learn's digits trains at the base batch, and at k = 8 times the batch and the learning
rate (the linear scaling rule) with no warmup, constant warmup (k lr / k for the warmup, then k lr) and gradual
warmup (linear from lr to k lr), each with and without momentum correction (the paper's sec. 2.1: the SGD
momentum buffer holds lr * grad, so when the LR jumps it is rescaled by new_lr / old_lr). Every row trains the
same number of epochs with the same step decays, from the same initial weights for a given seed. The large
batch is simulated on one process: a batch of k * n with LR k * lr is what k workers of batch n compute (the
gradient is the mean over k * n samples). BatchNorm normalises over ghost batches of n samples
(``virtual_batch_size``), as each of the paper's workers normalises its own n = 32 samples.

The validation error is measured after every epoch with "precise BN" statistics (recomputed over the training
set with the current weights; see ``_evaluation_callback``) and reported as the median of the last 5 epochs,
mean and std over seeds. Keras' moving-average statistics are also reported: at 5 iterations per epoch they
trail the weights by ~20 epochs, which inflates the large-batch error by an amount unrelated to warmup.

All settings are fixed in ``SETTINGS`` below, before any run. Each row is trained by
``hvd_sched.keras.ScheduledOptimizer(SGD(momentum=0.9), schedule, momentum_correction=...)`` with a schedule
from Detectron keys (``from_detectron``).

Usage::

    python bench/large_batch.py           # 10 seeds x 7 rows, ~12 min on 2 cores -> docs/bench/large_batch.{json,png}
    python bench/large_batch.py --quick   # 1 seed, 2 epochs (the test); writes only with --out-dir

The last line printed is one JSON object mapping each row to its validation error mean and std (percent).
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import _common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

#: Every setting, fixed before the runs (see the module docstring and bench/README.md for the reasons).
SETTINGS = {
    "dataset": "sklearn.datasets.load_digits (1797 8x8 images, 10 classes), pixels / 16",
    "train_size": 1280,  # stratified, fixed split (random_state 0); 1280 = 40 x 32 = 5 x 256: no ragged batch
    "split_seed": 0,
    "model": "conv3x3x16-BN-ReLU, conv3x3x32-BN-ReLU, maxpool 2, dense 10",
    "base_batch": 32,  # n, as the paper's per-worker batch
    "base_lr": 0.1,  # the paper's 0.1 for its reference batch
    "k": 8,  # large batch k * n = 256, LR k * 0.1 = 0.8
    "momentum": 0.9,
    "weight_decay": 1e-4,
    "epochs": 45,  # the paper's 90-epoch schedule at half the length
    "steps_epochs": [0, 15, 30, 40],  # LR / 10 at epochs 15, 30, 40 (the paper: 30, 60, 80 of 90)
    "gamma": 0.1,
    "warmup_epochs": 5,  # the paper's 5 epochs
    "warmup_factor": 1 / 8,  # 1 / k: warmup starts at the base LR (constant: stays there)
    "correction_threshold": 1.1,  # Detectron's SCALE_MOMENTUM_THRESHOLD
    "seeds": list(range(10)),
    "final_epochs": 5,  # the reported error is the median over the last 5 epochs' validation error
}
QUICK = {"epochs": 2, "steps_epochs": [0, 1], "warmup_epochs": 1, "seeds": [0]}

#: (row name, batch multiple, WARM_UP_METHOD or None, momentum correction)
ROWS = (
    ("baseline n=32", 1, None, "threshold"),
    ("k=8 no warmup, no correction", 8, None, "off"),
    ("k=8 no warmup, correction", 8, None, "threshold"),
    ("k=8 constant warmup, no correction", 8, "constant", "off"),
    ("k=8 constant warmup, correction", 8, "constant", "threshold"),
    ("k=8 gradual warmup, no correction", 8, "linear", "off"),
    ("k=8 gradual warmup, correction", 8, "linear", "threshold"),
)


def _data(settings):
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[..., None]
    y = digits.target.astype(np.int64)
    x_train, x_val, y_train, y_val = train_test_split(x, y, train_size=settings["train_size"], stratify=y,
                                                      random_state=settings["split_seed"])
    return x_train, y_train, x_val, y_val


def _model(tf, settings):
    virtual = settings["base_batch"]
    layers = tf.keras.layers
    return tf.keras.Sequential([
        tf.keras.Input((8, 8, 1)),
        layers.Conv2D(16, 3, padding="same", use_bias=False),
        layers.BatchNormalization(virtual_batch_size=virtual),
        layers.ReLU(),
        layers.Conv2D(32, 3, padding="same", use_bias=False),
        layers.BatchNormalization(virtual_batch_size=virtual),
        layers.ReLU(),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(10),
    ])


def _solver(settings, multiple, warmup):
    solver = {"BASE_LR": settings["base_lr"] * multiple, "LR_POLICY": "steps_with_decay",
              "GAMMA": settings["gamma"], "STEPS_EPOCHS": list(settings["steps_epochs"]),
              "MAX_EPOCHS": settings["epochs"], "SCALE_MOMENTUM_THRESHOLD": settings["correction_threshold"],
              "WEIGHT_DECAY": settings["weight_decay"], "MOMENTUM": settings["momentum"]}
    if warmup is None:
        solver["WARM_UP_ITERS"] = 0
    else:
        solver.update(WARM_UP_EPOCHS=settings["warmup_epochs"], WARM_UP_METHOD=warmup,
                      WARM_UP_FACTOR=settings["warmup_factor"])
    return solver


def _evaluation_callback(tf, x_train, x_val, y_val):
    """Validation error after each epoch, twice: with Keras' moving-average BN statistics, and with "precise BN".

    The moving averages (momentum 0.99) are updated once per iteration, so at k = 8 (5 iterations per epoch)
    they trail the weights by ~20 epochs and measure the averaging, not the network. Precise BN (as
    detectron2's ``PreciseBN`` hook): the statistics recomputed over the training set with the current weights
    (mean over ghost batches, as in training), used for this evaluation only, then the moving averages restored.
    """

    def error(model):
        logits = model(x_val, training=False)
        return float(np.mean(np.argmax(logits.numpy(), axis=1) != y_val))

    import numpy as np

    class Evaluate(tf.keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.moving, self.precise = [], []

        def on_epoch_end(self, epoch, logs=None):
            model = self.model
            layers = [layer for layer in model.layers if isinstance(layer, tf.keras.layers.BatchNormalization)]
            self.moving.append(error(model))
            saved = [(layer.moving_mean.numpy(), layer.moving_variance.numpy(), layer.momentum)
                     for layer in layers]
            for layer in layers:
                layer.momentum = 0.0  # the next training-mode call sets the statistics to its own
            model(x_train, training=True)
            self.precise.append(error(model))
            for layer, (mean, variance, momentum) in zip(layers, saved):
                layer.moving_mean.assign(mean)
                layer.moving_variance.assign(variance)
                layer.momentum = momentum

    return Evaluate()


def train_row(row, seed, settings, data):
    """Train one row with one seed; returns per-epoch training loss and error and validation errors (fractions)."""
    import hvd_sched
    import hvd_sched.keras
    import tensorflow as tf

    name, multiple, warmup, correction = row
    x_train, y_train, x_val, y_val = data
    batch = settings["base_batch"] * multiple
    steps_per_epoch = len(x_train) // batch
    schedule = hvd_sched.from_detectron(_solver(settings, multiple, warmup), steps_per_epoch=steps_per_epoch)
    tf.keras.utils.set_random_seed(seed)  # the same initial weights for every row of a seed
    model = _model(tf, settings)
    sgd = tf.keras.optimizers.SGD(momentum=settings["momentum"], weight_decay=settings["weight_decay"])
    optimizer = hvd_sched.keras.ScheduledOptimizer(sgd, schedule, momentum_correction=correction,
                                                   log_corrections=False)
    model.compile(optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    train = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
             .shuffle(len(x_train), seed=seed, reshuffle_each_iteration=True)
             .batch(batch, drop_remainder=True))
    evaluate = _evaluation_callback(tf, x_train, x_val, y_val)
    history = model.fit(train, epochs=settings["epochs"], verbose=0, callbacks=[evaluate]).history
    return {
        "train_loss": [float(v) for v in history["loss"]],
        "train_error": [1.0 - float(v) for v in history["accuracy"]],
        "val_error": evaluate.precise,
        "val_error_moving_bn": evaluate.moving,
        "iterations": steps_per_epoch * settings["epochs"],
        "corrections": len(schedule.momentum_corrections(steps_per_epoch * settings["epochs"]))
        if correction != "off" else 0,
    }


def _final_error(run, settings, key="val_error"):
    return statistics.median(run[key][-settings["final_epochs"]:])


def _mean_std(values):
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return mean, std


def _plot(path, rows, runs, settings):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    epochs = np.arange(1, settings["epochs"] + 1)
    styles = {None: "-", "constant": "--", "linear": "-"}
    colors = ["black", "tab:red", "tab:orange", "tab:purple", "tab:pink", "tab:blue", "tab:cyan"]
    for color, row in zip(colors, rows):
        name, multiple, warmup, correction = row
        loss = np.mean([run["train_loss"] for run in runs[name]], axis=0)
        error = np.mean([run["val_error"] for run in runs[name]], axis=0) * 100
        style = ":" if correction == "off" and multiple > 1 else styles[warmup]
        axes[0].plot(epochs, loss, style, color=color, label=name)
        axes[1].plot(epochs, error, style, color=color, label=name)
    for boundary in settings["steps_epochs"][1:]:
        for axis in axes:
            axis.axvline(boundary, color="0.85", linewidth=0.8, zorder=0)
    axes[0].set(yscale="log", xlabel="epoch", ylabel="training loss (mean over seeds)",
                title="training loss")
    axes[1].set(yscale="log", xlabel="epoch", ylabel="validation error % (mean over seeds)",
                title="validation error")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"digits, small CNN: batch {settings['base_batch']} vs k={settings['k']} "
                 f"(batch {settings['base_batch'] * settings['k']}, LR x{settings['k']}), "
                 f"{len(settings['seeds'])} seed(s)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(settings):
    """Train every row for every seed; returns the report (settings, table, per-run curves, machine)."""
    import tensorflow as tf

    _common.limit_threads(1)
    tf.get_logger().setLevel("ERROR")  # each row builds a new model: Keras warns about retracing
    data = _data(settings)
    started = time.perf_counter()
    rows = [row for row in ROWS if row[1] in (1, settings["k"])]
    runs = {row[0]: [] for row in rows}
    for seed in settings["seeds"]:
        for row in rows:
            runs[row[0]].append(train_row(row, seed, settings, data))
    table = {}
    for name, multiple, warmup, correction in rows:
        errors = [_final_error(r, settings) * 100 for r in runs[name]]
        moving = [_final_error(r, settings, "val_error_moving_bn") * 100 for r in runs[name]]
        losses = [r["train_loss"][-1] for r in runs[name]]
        mean, std = _mean_std(errors)
        moving_mean, moving_std = _mean_std(moving)
        table[name] = {"val_error_mean": round(mean, 3), "val_error_std": round(std, 3),
                       "val_error_moving_bn_mean": round(moving_mean, 3),
                       "val_error_moving_bn_std": round(moving_std, 3),
                       "final_train_loss_median": statistics.median(losses),
                       "per_seed": [round(e, 3) for e in errors],
                       "failed_seeds": sum(e > 50 for e in errors),
                       "iterations": runs[name][0]["iterations"], "corrections": runs[name][0]["corrections"],
                       "warmup": warmup or "none", "momentum_correction": correction,
                       "batch": settings["base_batch"] * multiple, "base_lr": settings["base_lr"] * multiple}
    duration = time.perf_counter() - started
    report = {"machine": _common.machine(), "settings": settings, "duration_s": round(duration, 1),
              "table": table, "runs": runs}
    return report


def markdown_table(report):
    lines = ["| row | batch | LR | iterations | corrections | val error % (mean ± std) | seeds > 50 % | "
             "val error %, moving-average BN | final train loss (median) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, row in report["table"].items():
        lines.append(f"| {name} | {row['batch']} | {row['base_lr']:g} | {row['iterations']} | "
                     f"{row['corrections']} | {row['val_error_mean']:.2f} ± {row['val_error_std']:.2f} | "
                     f"{row['failed_seeds']} / {len(row['per_seed'])} | "
                     f"{row['val_error_moving_bn_mean']:.2f} ± {row['val_error_moving_bn_std']:.2f} | "
                     f"{row['final_train_loss_median']:.2g} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 epochs")
    parser.add_argument("--out-dir", default=None,
                        help="where large_batch.json and large_batch.png go (default: docs/ without --quick)")
    args = parser.parse_args(argv)
    from hvd_sched._compat import keras_major  # no TensorFlow import

    if keras_major() == 3:
        # Each of the paper's workers normalises its own 32 samples: Keras 2's BatchNormalization(virtual_batch_size),
        # which Keras 3 does not have. The figures in docs/bench/large_batch.json are Keras 2's (tf2.15 row).
        parser.error("needs Keras 2 (BatchNormalization(virtual_batch_size=...)); run it on the tf2.15 or tf2.21 row")
    settings = dict(SETTINGS)
    if args.quick:
        settings.update(QUICK)
        settings["final_epochs"] = 1
    out_dir = args.out_dir if args.out_dir is not None else (None if args.quick else str(_common.RAW_DIR))
    report = run(settings)
    report["command"] = "python bench/large_batch.py" + (" --quick" if args.quick else "")
    print(markdown_table(report))
    print(f"took {report['duration_s']:.0f} s")
    if out_dir is not None:
        out_dir = pathlib.Path(out_dir)
        _common.write_json(out_dir / "large_batch.json", report)
        _plot(out_dir / "large_batch.png", [row for row in ROWS if row[0] in report["table"]], report["runs"],
              settings)
        print(f"wrote {out_dir / 'large_batch.json'} and {out_dir / 'large_batch.png'}")
    print(json.dumps({name: {"mean": row["val_error_mean"], "std": row["val_error_std"]}
                      for name, row in report["table"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
