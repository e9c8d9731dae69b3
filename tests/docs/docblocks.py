"""The code blocks of the README and of the documentation site (docs/), as the tests run them.

A fenced block's language says what the test does with it:

- ``python``: run, in a fresh interpreter of the row's venv, in a temporary folder where ``examples/`` is the
  repository's (so the blocks' relative paths work and nothing is written into the tree);
- ``pycon``: run as a doctest there, every output compared (``...`` matches anything, doctest's ELLIPSIS);
- ``console``: each ``$ `` line is a command (``python``, ``hvd-sched`` and ``horovodrun`` from the row's venv);
  the lines after it are its output, compared the same way (a line ``...`` stands for any lines);
- ``yaml``: parsed; one with a ``SOLVER`` section is read by ``hvd_sched.from_detectron`` (a valid config).

An HTML comment on the line before the fence changes that, and says why:

- ``<!-- test: skip REASON -->``: not run (it needs a GPU, a cluster, a user's data); a ``python`` block is still
  compiled, so its syntax is checked;
- ``<!-- test: prelude NAME -->``: the prelude ``NAME`` of ``PRELUDES`` runs first, in the same interpreter: it
  defines what the text leaves to the reader (``model``, the data), nothing the block shows.

Other languages (``bash``, ``text``) are shown, not run.
"""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<lang>[\w-]*)[^\n]*$")
_MARK = re.compile(r"^\s*<!-- test: (?P<kind>skip|prelude) (?P<arg>.+?) -->\s*$")
RUN_LANGS = ("python", "pycon", "console", "yaml")

#: What a page leaves to the reader, made small: digits, one Dense model, Horovod on one process.
_DIGITS = """
import hvd_sched, hvd_sched.keras
import numpy as np, tensorflow as tf, horovod.tensorflow.keras as hvd
from sklearn.datasets import load_digits
hvd.init()
_digits = load_digits()
x_shard = (_digits.data / 16.0).astype("float32")[hvd.rank()::hvd.size()]
y_shard = _digits.target[hvd.rank()::hvd.size()]
x, y = x_shard, y_shard
model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(10, activation="softmax")])
"""

#: The model compiled with a scheduled optimizer, and a seeded data stream that skips the micro-batches used.
_COMPILED_AND_STREAM = """
from hvd_sched.keras import horovod_callbacks
schedule = hvd_sched.from_detectron("examples/configs/e2e_faster_rcnn_R-50-FPN_1x.yaml")
model.compile(hvd_sched.keras.DistributedOptimizer(hvd_sched.keras.ScheduledOptimizer(
    tf.keras.optimizers.SGD(momentum=0.9), schedule)), "sparse_categorical_crossentropy", jit_compile=False)
def make_dataset(skip=0):
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=1).repeat().batch(32)
    return data.skip(skip)
"""

#: "Off the cluster": the model and data stream of the 2-rank job whose checkpoint the block fine-tunes.
_FINE_TUNE_MODEL = """
import numpy as np, tensorflow as tf
from sklearn.datasets import load_digits
steps, epochs = 10, 3
def make_model():
    tf.keras.utils.set_random_seed(1)
    return tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(32, activation="relu"),
                                tf.keras.layers.Dense(10, activation="softmax")])
def make_dataset(skip=0, rank=0, size=1):
    digits = load_digits()
    x, y = (digits.data / 16.0).astype("float32")[rank::size], digits.target[rank::size]
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=1).repeat().batch(32).skip(skip)
"""

#: ... and that job itself, run for real (horovodrun --gloo, 2 ranks, 2 epochs), its checkpoint in runs/ckpt.
_FINE_TUNE_JOB = _FINE_TUNE_MODEL + """
import hvd_sched, hvd_sched.keras as hk, horovod.tensorflow.keras as hvd
hvd.init()
model = make_model()
schedule = hvd_sched.from_detectron("examples/configs/digits_warmup_steps.yaml", world_size=hvd.size(),
                                    steps_per_epoch=steps)
model.compile(hk.DistributedOptimizer(hk.ScheduledOptimizer(tf.keras.optimizers.SGD(momentum=0.9), schedule)),
              "sparse_categorical_crossentropy")
model.fit(make_dataset(rank=hvd.rank(), size=hvd.size()), steps_per_epoch=steps, epochs=2, verbose=0,
          callbacks=hk.horovod_callbacks(checkpoint=hk.TrainingCheckpoint("runs/ckpt")))
"""

_FINE_TUNE = _FINE_TUNE_MODEL + f"""
import os, subprocess, sys
with open("fine_tune_job.py", "w") as _file:
    _file.write({_FINE_TUNE_JOB!r})
subprocess.run([os.path.join(os.path.dirname(sys.executable), "horovodrun"), "-np", "2", "-H", "localhost:2",
                "--gloo", sys.executable, "fine_tune_job.py"], check=True, timeout=300, stdout=subprocess.DEVNULL)
"""

PRELUDES = {
    # the ten lines of `model.fit`: a model and this rank's shard of the data
    "fit": _DIGITS,
    # "In your own script" (preemption): the stream, the steps per epoch, the epochs, the micro-batches per update
    "resume": _DIGITS + _COMPILED_AND_STREAM + """
steps, epochs, iter_size = 10, 2, 1
""",
    # the examples in hvd_sched's docstrings (the reference pages), run one after another on these names
    "docstrings": _DIGITS + _COMPILED_AND_STREAM + """
from hvd_sched.keras import ScheduleCallback, ScheduleLR, EpochCheckpoint, LearningRateLogger
sgd = tf.keras.optimizers.SGD(momentum=0.9)
model.save("runs/model.keras")
steps = steps_per_epoch = 22
callbacks = horovod_callbacks()
""",
    # "Off the cluster": the checkpoint of a real 2-rank job (horovodrun --gloo, 2 epochs of 10 iterations of the
    # digits, the demo's config), and the model and data stream the job used, for the block that fine-tunes it
    "fine_tune": _FINE_TUNE,
    # "Large batches": a SOLVER with ITER_SIZE 2, the micro-batch size and the updates per epoch
    "accumulate": _DIGITS + """
from hvd_sched.keras import horovod_callbacks
solver = {"BASE_LR": 0.05, "REFERENCE_WORLD_SIZE": 1, "ITER_SIZE": 2, "LR_POLICY": "steps_with_decay",
          "STEPS": [0, 20], "MAX_ITER": 40, "WARM_UP_ITERS": 5}
k, micro_batch, updates_per_epoch = 2, 32, 10
""",
}


class Block:
    """One fenced block: where it is, its language, its text, and its test comment (skip / prelude)."""

    def __init__(self, path, line, lang, text, kind=None, arg=None):
        self.path, self.line, self.lang, self.text, self.kind, self.arg = path, line, lang, text, kind, arg

    @property
    def id(self):
        return f"{self.path.relative_to(ROOT).as_posix()}:{self.line}"


def blocks(path):
    """Every fenced block of a Markdown file, in order (nested fences inside a block are its text)."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, lang = len(match["indent"]), match["fence"], match["lang"]
        mark = _MARK.match(lines[i - 1]) if i else None
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^ {{0,{indent}}}{fence}\s*$", lines[j]):
            body.append(lines[j][indent:] if lines[j].startswith(" " * indent) else lines[j])
            j += 1
        if j == len(lines):
            raise ValueError(f"{path}:{i + 1}: the fence {fence}{lang} is never closed")
        found.append(Block(path, i + 1, lang, "\n".join(body) + "\n", mark and mark["kind"], mark and mark["arg"]))
        i = j + 1
    return found


def pages():
    """The README and every page of the site (docs/, but not the benchmarks' raw printouts in docs/bench)."""
    return [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").rglob("*.md") if "bench" not in p.parts)


def console_steps(text):
    """A console block as [(command, expected output)]."""
    steps = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append([line[2:], []])
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"console block: output before the first `$ ` line: {line!r}")
    return [(command, "\n".join(out).rstrip("\n") + "\n" if out else "") for command, out in steps]


def docstring_blocks():
    """(where, code) of every fenced Python block in hvd_sched's docstrings, read from the source (the reference
    pages render them; the pure modules' `>>>` examples are doctests, run by test_docstrings.py)."""
    found = []
    for path in sorted((ROOT / "hvd_sched").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node) or ""
                found += [(f"{path.relative_to(ROOT)} ({getattr(node, 'name', 'module')})", code)
                          for code in re.findall(r"```python\n(.*?)```", doc, re.S)]
    return found
