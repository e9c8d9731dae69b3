"""Every export of a model trained on 2 ranks loads and predicts the same where Horovod and hvd_sched are absent
(issue 46: a TF Serving container, a notebook), and hvd_sched.keras.load_model gives it back with its optimizer
where hvd_sched is installed without Horovod (fine-tuning on one machine).

The model: the tests' MLP, `DistributedOptimizer(ScheduledOptimizer(SGD(momentum=0.9)))`, 2 epochs on 2 real
Gloo ranks (`horovodrun -np 2`); rank 0 saves it in every format this Keras has: `model.save` to `.keras` and
`.h5`, to a SavedModel directory (Keras 2: `save_format="tf"`, what TF Serving reads), `tf.saved_model.save`, and
`model.export` (Keras' serving export). Each is loaded in an environment of this row without Horovod and without
hvd_sched (tests/nohorovod.py), `compile=False` for Keras' loader, `tf.saved_model.load` and its
`serving_default` signature for the SavedModels, and must predict what the trained model predicted (1e-6).
Before the fix a SavedModel of Keras 2 held Horovod's allreduce and failed there with "Op type not registered
'HorovodAllreduce'" (horovod #4028).

On every row (the formats and the loaders differ between Keras 2 built in, tf-keras and Keras 3).
"""

import json
import textwrap

import numpy as np
import pytest

import nohorovod
import rows
from launch import horovodrun_cmd, run_and_collect
from stackutil import KERAS_MAJOR

pytestmark = [pytest.mark.multirank, pytest.mark.depends_on(*rows.KERAS), pytest.mark.timeout(600)]

MU = 0.9
#: The 2-rank job's schedule: 20 iterations (2 epochs of 10 global batches of 16, 8 per rank) of it.
SOLVER = {"BASE_LR": 0.2, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 10], "MAX_ITER": 30,
          "WARM_UP_ITERS": 0}
#: A new schedule for fine-tuning: its LR at iteration 20 (0.05) is 2.5x the job's last (0.02), and it steps at 25.
FINE_SOLVER = {"BASE_LR": 0.05, "LR_POLICY": "steps_with_decay", "GAMMA": 0.1, "STEPS": [0, 25], "MAX_ITER": 40,
               "WARM_UP_ITERS": 0}

TRAIN = f"SOLVER, MU = {SOLVER!r}, {MU!r}\n" + """
import os, sys
import numpy as np
import tensorflow as tf
import hvd_sched, hvd_sched.keras as hk
import rankutil
from stackutil import KERAS_MAJOR
import horovod.tensorflow.keras as hvd

hvd.init()
directory = sys.argv[1]
rank, size = hvd.rank(), hvd.size()
tf.config.experimental.enable_op_determinism()
schedule = hvd_sched.from_detectron(SOLVER)
model = rankutil.make_mlp(seed=1)
if rank == 0:
    np.savez(os.path.join(directory, "initial.npz"), *model.get_weights())
model.compile(hk.DistributedOptimizer(hk.ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=MU), schedule)),
              "mse")
x, y = rankutil.make_regression(n=160, seed=3)
xs, ys = rankutil.shard_batches(x, y, 16, rank, size)
checkpoint = hk.TrainingCheckpoint(os.path.join(directory, "ckpt"))
model.fit(xs, ys, batch_size=8, epochs=2, shuffle=False, verbose=0,
          callbacks=hk.horovod_callbacks(checkpoint=checkpoint))
saved = {}
if rank == 0:
    def save(name, how):
        try:
            how(os.path.join(directory, name))
            saved[name] = "saved"
        except Exception as error:  # a format this Keras does not write: reported, the test decides
            saved[name] = f"{type(error).__name__}: {error}"[:300]
    save("model.keras", model.save)
    save("model.h5", model.save)
    if KERAS_MAJOR == 2:
        save("savedmodel", lambda path: model.save(path, save_format="tf"))
    save("tf_saved_model", lambda path: tf.saved_model.save(model, path))
    save("export", model.export)
    np.save(os.path.join(directory, "x.npy"), x)
    np.save(os.path.join(directory, "predicted.npy"), model.predict(x, verbose=0))
hvd.allreduce(tf.constant(0.0), name="exports_saved")
rankutil.emit({"saved": saved, "iterations": int(hk.iteration_count(model.optimizer))})
"""

SERVE = """
import json, os, sys
import numpy as np
import tensorflow as tf

directory = sys.argv[1]
x = np.load(os.path.join(directory, "x.npy"))
expected = np.load(os.path.join(directory, "predicted.npy"))
found = {"modules": sorted({m.split(".")[0] for m in sys.modules} & {"horovod", "hvd_sched"})}
for name in json.loads(sys.argv[2]):
    path = os.path.join(directory, name)
    try:
        if name in ("tf_saved_model", "export"):
            served = tf.saved_model.load(path).signatures["serving_default"]
            outputs = served(tf.constant(x))
            (predicted,) = outputs.values()
        else:
            predicted = tf.keras.models.load_model(path, compile=False).predict(x, verbose=0)
        found[name] = float(np.abs(np.asarray(predicted) - expected).max())
    except Exception as error:
        found[name] = f"{type(error).__name__}: {error}"[:600]
found["modules"] = sorted({m.split(".")[0] for m in sys.modules} & {"horovod", "hvd_sched"})
print(json.dumps(found))
"""

FINE_TUNE = """
import json, os, sys
import numpy as np
import hvd_sched.keras as hk

directory = sys.argv[1]
x = np.load(os.path.join(directory, "x.npy"))
expected = np.load(os.path.join(directory, "predicted.npy"))
found = {}
for name in json.loads(sys.argv[2]):
    model = hk.load_model(os.path.join(directory, name))
    found[name] = {"gap": float(np.abs(model.predict(x, verbose=0) - expected).max()),
                   "class": type(model.optimizer).__name__, "iterations": int(hk.iteration_count(model.optimizer))}
print(json.dumps(found))
"""


def _keras_formats():
    return ["model.keras", "model.h5"] + (["savedmodel"] if KERAS_MAJOR == 2 else [])


@pytest.fixture(scope="module")
def environments(tmp_path_factory):
    folder = tmp_path_factory.mktemp("envs")
    return {"serving": nohorovod.environment(folder / "serving", without=("horovod", "hvd_sched")),
            "laptop": nohorovod.environment(folder / "laptop", without=("horovod",))}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The 2-rank job's folder (its saved formats, x.npy, predicted.npy) and rank 0's result."""
    work = tmp_path_factory.mktemp("trained")
    script = work / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    results, _ = run_and_collect(horovodrun_cmd(2, script, [work]), work, 2, 300, None)
    assert results[0]["iterations"] == results[1]["iterations"] == 20
    return work, results[0]


def _json(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_export_of_a_two_rank_model_serves_the_same_without_horovod_and_hvd_sched(trained, environments):
    work, result = trained
    saved = result["saved"]
    expected_formats = _keras_formats() + ["tf_saved_model", "export"]
    assert {name: saved.get(name) for name in expected_formats} == dict.fromkeys(expected_formats, "saved"), saved
    found = _json(nohorovod.run(environments["serving"], _with_argv(SERVE, work, expected_formats), work, tree=False))
    assert found.pop("modules") == [], found
    for name in expected_formats:
        assert isinstance(found[name], float) and found[name] <= 1e-6, (name, found[name])


def test_a_two_rank_model_comes_back_with_its_optimizer_where_hvd_sched_has_no_horovod(trained, environments):
    work, _ = trained
    formats = _keras_formats() if KERAS_MAJOR == 2 else ["model.keras"]  # Keras 3's .h5 drops the slots: refused
    found = _json(nohorovod.run(environments["laptop"], _with_argv(FINE_TUNE, work, formats), work,
                                env={"PYTHONPATH": nohorovod.PATHS}))
    for name in formats:
        assert found[name]["gap"] <= 1e-6 and found[name]["iterations"] == 20, (name, found[name])
        assert found[name]["class"] == "ScheduledSGD", (name, found[name])


def _with_argv(code, work, formats):
    return f"import sys\nsys.argv = ['', {str(work)!r}, {json.dumps(json.dumps(formats))}]\n" + code


FINE_TUNE_CHECKPOINT = """
import json, os, sys
import numpy as np
import tensorflow as tf
import hvd_sched, hvd_sched.keras as hk
import rankutil

directory, solver, rule = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
tf.config.experimental.enable_op_determinism()
model = rankutil.make_mlp(seed=7)  # other weights: the checkpoint's must replace them
model.compile(hk.ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), hvd_sched.from_detectron(solver)), "mse")
found = {}
try:
    hk.restore_latest(os.path.join(directory, "ckpt"), model)
except ValueError as error:
    found["refused"] = str(error)
meta = hk.restore_latest(os.path.join(directory, "ckpt"), model, lr_rule=rule)
found.update(iteration=meta["iteration"], world_size=meta["world_size"], slot_factor=meta["slot_factor"])
x, y = rankutil.make_regression(n=160, seed=3)
model.fit(x[:80], y[:80], batch_size=8, epochs=1, shuffle=False, verbose=0)
found["after"] = int(hk.iteration_count(model.optimizer))
np.savez(os.path.join(directory, f"fine_tuned_{rule}.npz"), *model.get_weights())
print(json.dumps(found))
"""


def _detectron_walk(lrs, threshold=1.1):
    """{iteration: factor}: Detectron's UpdateWorkspaceLr over the LR of each iteration (the LR blob starts at 0;
    V is scaled by new/cur where the ratio passes SCALE_MOMENTUM_THRESHOLD)."""
    out, cur = {}, np.float32(0.0)
    for it, new in enumerate(lrs):
        new = np.float32(new)
        if cur != new and float(cur) > 1e-7 and max(float(new) / float(cur), float(cur) / float(new)) > threshold:
            out[it] = np.float32(new / cur)
        cur = new
    return out


@pytest.mark.parametrize("rule", ["linear", "schedule"])
def test_a_two_rank_checkpoint_fine_tunes_in_one_process_without_horovod_as_detectron(trained, environments, rule):
    """The 2-rank job's TrainingCheckpoint (iteration 20, global batch 16) goes on in one process without Horovod
    (batch 8) for 10 iterations, by each rule of restore_latest:

    - "linear": the job's schedule, its LR scaled by 1/2 (the world sizes), the momentum slots by 1/2;
    - "schedule": a new schedule (FINE_SOLVER: 0.05 at 20, a step at 25), the slots by 0.05/0.02 at 20.

    Reference: Detectron's SGD in numpy over the whole LR sequence (the job's 20, then the rule's), momentum
    corrected by Detectron's own walk over that sequence, on the job's global batches and then the batches of 8."""
    work, _ = trained
    solver = SOLVER if rule == "linear" else FINE_SOLVER
    proc = nohorovod.run(environments["laptop"], f"import sys\nsys.argv = ['', {str(work)!r}, "
                         f"{json.dumps(json.dumps(solver))}, {rule!r}]\n" + FINE_TUNE_CHECKPOINT, work,
                         env={"PYTHONPATH": nohorovod.PATHS})
    found = _json(proc)
    assert found["iteration"] == 20 and found["world_size"] == 2 and found["after"] == 30, found
    assert found["refused"].startswith(f"the checkpoint {work / 'ckpt' / 'epoch-0001'} (iteration 20) was written "
                                       "by 2 ranks and this job has 1"), found["refused"]
    assert "lr_rule='linear'" in found["refused"] and "lr_rule='schedule'" in found["refused"]

    from reference import detectron_lr, train_detectron_sgd
    from rankutil import make_regression

    x, y = make_regression(n=160, seed=3)
    lrs = [detectron_lr(it, SOLVER) for it in range(20)]
    if rule == "linear":
        lrs += [np.float32(detectron_lr(it, SOLVER)) * np.float32(0.5) for it in range(20, 30)]
    else:
        lrs += [detectron_lr(it, FINE_SOLVER) for it in range(20, 30)]
    corrections = _detectron_walk(lrs)
    assert corrections[20] == np.float32(0.5 if rule == "linear" else 2.5), corrections
    assert found["slot_factor"] == pytest.approx(float(corrections[20]), rel=1e-6), found
    batches = [(x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16]) for i in range(10)] * 2
    batches += [(x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8]) for i in range(10)]
    initial = list(np.load(work / "initial.npz").values())
    expected = train_detectron_sgd(initial, batches, lrs, corrections, MU)
    got = list(np.load(work / f"fine_tuned_{rule}.npz").values())
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
