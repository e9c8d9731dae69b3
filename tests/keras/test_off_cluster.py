"""hvd_sched.keras where Horovod is not installed (issue 46: a laptop, a notebook, one GPU off the cluster).

Each case runs in a real environment of this row without Horovod (tests/nohorovod.py: a venv whose site-packages
links every package of this one except Horovod's), not with a mock: `import horovod` fails there as after `pip
uninstall horovod`. On every row (Keras 2 built in, tf-keras, Keras 3: the import path and the solver differ).

- `import hvd_sched.keras` works there and imports no Horovod; the names that need Horovod raise
  HorovodMissingError naming themselves and the install, and a launcher's job of several processes is stopped the
  same way (before the first step);
- the solver, the callbacks and TrainingCheckpoint train there exactly as in one Horovod rank (to the bit), and as
  the numpy re-derivation of Detectron's update (tests/reference.py);
- a Horovod that is installed but does not load is still refused at import, as before.
"""

import json
import os
import pathlib
import sys

import numpy as np
import pytest

import nohorovod
from reference import detectron_corrections, detectron_lr, train_detectron_sgd

ROOT = pathlib.Path(__file__).resolve().parents[2]
PATHS = os.pathsep.join([str(ROOT), str(ROOT / "tests")])

BATCH, STEPS_PER_EPOCH, EPOCHS, MU = 16, 10, 3, 0.9
N_ITERS = STEPS_PER_EPOCH * EPOCHS
# A warm-up, then two LR steps (each a momentum correction, V scaled by new_lr / old_lr).
SOLVER = {"BASE_LR": 0.2, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 10, 20], "MAX_ITER": N_ITERS,
          "WARM_UP_ITERS": 5, "WARM_UP_FACTOR": 0.25, "WARM_UP_METHOD": "constant"}

TRAIN = f"""
import json, os, sys
import numpy as np
import hvd_sched, hvd_sched.keras as hk
import tensorflow as tf
from rankutil import make_mlp, make_regression

tf.config.experimental.enable_op_determinism()
with_horovod = os.environ["MODE"] == "horovod"
if with_horovod:
    import horovod.tensorflow.keras as hvd
    hvd.init()
schedule = hvd_sched.from_detectron({SOLVER!r})
optimizer = hk.ScheduledOptimizer(tf.keras.optimizers.SGD(momentum={MU}), schedule)
if with_horovod:
    optimizer = hk.DistributedOptimizer(optimizer)
model = make_mlp(seed=1)
np.savez("initial.npz", *model.get_weights())
model.compile(optimizer, "mse")
x, y = make_regression(n={BATCH * STEPS_PER_EPOCH}, seed=3)
checkpoint = hk.TrainingCheckpoint("ckpt", period=7)
model.fit(x, y, batch_size={BATCH}, epochs={EPOCHS}, shuffle=False, verbose=0,
          callbacks=hk.horovod_callbacks(checkpoint=checkpoint))
np.savez("final.npz", *model.get_weights())
print(json.dumps({{"iteration": hk.iteration_count(optimizer), "horovod": sorted(m for m in sys.modules
                   if m.split(".")[0] == "horovod")[:3], "latest": hk.latest_checkpoint("ckpt")["iteration"]}}))
"""


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """This row's Python without Horovod."""
    return nohorovod.environment(tmp_path_factory.mktemp("env") / "no-horovod", without=("horovod",))


def _last_json(proc):
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_horovod_is_really_absent_there(bare, tmp_path):
    proc = nohorovod.run(bare, "import importlib.util, importlib.metadata as m\n"
                               "print(importlib.util.find_spec('horovod'))\n"
                               "try:\n    m.version('horovod')\nexcept m.PackageNotFoundError:\n    print('none')\n"
                               "import tensorflow, numpy", tmp_path)
    assert proc.returncode == 0 and proc.stdout.split() == ["None", "none"], proc.stdout + proc.stderr


def test_hvd_sched_keras_imports_without_horovod_and_the_names_that_need_it_name_the_install(bare, tmp_path):
    code = """
import json, sys
import hvd_sched.keras as hk
from hvd_sched import _compat
import tensorflow as tf
found = {"loaded": sorted(m for m in sys.modules if m.split(".")[0] == "horovod"), "HOROVOD": _compat.HOROVOD}
uses = {"DistributedOptimizer": lambda: hk.DistributedOptimizer(tf.keras.optimizers.SGD()),
        "BroadcastVariables": lambda: hk.BroadcastVariables(),
        "AverageMetrics": lambda: hk.AverageMetrics(),
        "ElasticLRScaler": lambda: hk.ElasticLRScaler(tf.keras.optimizers.SGD()),
        "elastic_state": lambda: hk.elastic_state(None)}
for name, use in uses.items():
    try:
        use()
        found[name] = None
    except hk.HorovodMissingError as error:
        found[name] = [type(error).__name__, isinstance(error, ImportError), str(error)]
print(json.dumps(found))
"""
    found = _last_json(nohorovod.run(bare, code, tmp_path))
    assert found.pop("loaded") == [] and found.pop("HOROVOD") is False
    for name, (kind, is_import_error, message) in found.items():
        assert kind == "HorovodMissingError" and is_import_error, (name, kind)
        assert message.startswith(f"hvd_sched.keras.{name} needs Horovod, and Horovod is not installed in this "
                                  f"environment ({bare})"), message
        assert "bash scripts/install.sh" in message and "docs/how-to/off-cluster.md" in message, message


def test_a_launchers_job_of_several_processes_without_horovod_stops_before_training_naming_the_install(bare,
                                                                                                      tmp_path):
    """`mpirun -np 2` of a script on hosts without Horovod: each process would train alone as rank 0. The
    launcher guard stops it at the first call that builds the job (here horovod_callbacks), naming the install."""
    code = """
import hvd_sched.keras as hk
try:
    hk.horovod_callbacks()
except hk.HorovodMissingError as error:
    print(error)
"""
    proc = nohorovod.run(bare, code, tmp_path, env={"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.startswith("hvd_sched: Open MPI's mpirun started this process as one of 2 "
                                  "(OMPI_COMM_WORLD_SIZE=2, rank 1): a job of several processes needs Horovod, and "
                                  "Horovod is not installed"), proc.stdout
    assert "bash scripts/install.sh" in proc.stdout


def test_the_solver_trains_without_horovod_exactly_as_in_one_horovod_rank_and_as_detectron(bare, tmp_path):
    runs = {}
    for mode, python in (("bare", bare), ("horovod", None)):
        work = tmp_path / mode
        work.mkdir()
        python = python or sys.executable  # this row's own, with Horovod
        found = _last_json(nohorovod.run(python, TRAIN, work, env={"MODE": mode, "PYTHONPATH": PATHS}))
        assert found["iteration"] == N_ITERS and found["latest"] == N_ITERS, found
        assert (found["horovod"] == []) == (mode == "bare"), found
        runs[mode] = work
    final = {mode: list(np.load(work / "final.npz").values()) for mode, work in runs.items()}
    for a, b in zip(final["bare"], final["horovod"]):
        np.testing.assert_array_equal(a, b)
    initial = list(np.load(runs["bare"] / "initial.npz").values())
    x, y = _regression()
    batches = [(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]) for i in range(STEPS_PER_EPOCH)] * EPOCHS
    expected = train_detectron_sgd(initial, batches, [detectron_lr(it, SOLVER) for it in range(N_ITERS)],
                                   detectron_corrections(N_ITERS, SOLVER), MU)
    for got, want in zip(final["bare"], expected):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def _regression():
    from rankutil import make_regression

    return make_regression(n=BATCH * STEPS_PER_EPOCH, seed=3)


def test_a_horovod_that_is_installed_but_does_not_load_is_still_refused(tmp_path):
    """An installed Horovod whose library does not load (built for another TensorFlow: an undefined symbol) stops
    `import hvd_sched.keras` with the stack error, as before: only a Horovod that is not installed at all is
    taken for one process."""
    python = nohorovod.environment(tmp_path / "broken", without=("horovod",))
    site = pathlib.Path(nohorovod.run(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                                      tmp_path, tree=False).stdout.strip())
    (site / "horovod" / "tensorflow").mkdir(parents=True)
    (site / "horovod" / "__init__.py").write_text("")
    (site / "horovod" / "tensorflow" / "__init__.py").write_text(
        "raise ImportError('horovod/tensorflow/mpi_lib.so: undefined symbol: _ZN10tensorflow8OpKernel')\n")
    info = site / "horovod-0.28.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: horovod\nVersion: 0.28.1\n")
    proc = nohorovod.run(python, "import hvd_sched.keras", tmp_path)
    assert proc.returncode != 0
    assert "UnsupportedStackError" in proc.stderr and "horovod.tensorflow does not load on TensorFlow" in proc.stderr \
        and "undefined symbol" in proc.stderr, proc.stderr[-4000:]
