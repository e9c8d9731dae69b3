"""`hvd_sched.snapshot_period`: Detectron's checkpoint period, int(TRAIN.SNAPSHOT_ITERS / NUM_GPUS), from a YAML.

Detectron's tools/train_net.py (detectron/utils/train.py) computes `CHECKPOINT_PERIOD = int(cfg.TRAIN.SNAPSHOT_ITERS
/ cfg.NUM_GPUS)` and saves when `(cur_iter + 1) % CHECKPOINT_PERIOD == 0`, i.e. after every multiple of the period
of completed iterations, which is where TrainingCheckpoint(period=...) saves.
"""

import pytest

import hvd_sched


def _yaml(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, period", [
    ("NUM_GPUS: 8\nTRAIN:\n  SNAPSHOT_ITERS: 20000\nSOLVER:\n  BASE_LR: 0.02\n", 2500),  # Detectron's defaults
    ("TRAIN:\n  SNAPSHOT_ITERS: 500\nSOLVER:\n  BASE_LR: 0.02\n", 500),  # NUM_GPUS: Detectron's default 1
    ("NUM_GPUS: 3\nTRAIN:\n  SNAPSHOT_ITERS: 1000\n", 333),  # int() truncates, as Detectron's
    ("NUM_GPUS: 2\nTRAIN:\n  SNAPSHOT_ITERS: '1000'\n", 500),  # a string decoded as Detectron decodes it
])
def test_the_period_is_detectrons(tmp_path, text, period):
    assert hvd_sched.snapshot_period(_yaml(tmp_path, text)) == period


def test_no_snapshot_iters_means_epoch_ends_only(tmp_path):
    assert hvd_sched.snapshot_period(_yaml(tmp_path, "SOLVER:\n  BASE_LR: 0.02\n")) is None
    assert hvd_sched.snapshot_period(_yaml(tmp_path, "TRAIN:\n  WEIGHTS: x.pkl\nSOLVER:\n  BASE_LR: 0.1\n")) is None


@pytest.mark.parametrize("text, error, message", [
    ("TRAIN:\n  SNAPSHOT_ITERS: 0\n", ValueError, "TRAIN.SNAPSHOT_ITERS must be >= 1, got 0"),
    # Detectron's merge refuses a float where its default is an int; so does this.
    ("TRAIN:\n  SNAPSHOT_ITERS: '1e3'\n", TypeError, r"TRAIN.SNAPSHOT_ITERS must be an int, got 1000.0"),
    ("NUM_GPUS: 0\nTRAIN:\n  SNAPSHOT_ITERS: 10\n", ValueError, "NUM_GPUS must be >= 1, got 0"),
    ("NUM_GPUS: 8\nTRAIN:\n  SNAPSHOT_ITERS: 4\n", ValueError,
     "TRAIN.SNAPSHOT_ITERS 4 / NUM_GPUS 8 is below one iteration"),
])
def test_bad_values_are_named(tmp_path, text, error, message):
    with pytest.raises(error, match=message):
        hvd_sched.snapshot_period(_yaml(tmp_path, text))


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        hvd_sched.snapshot_period(tmp_path / "nope.yaml")
