"""``import hvd_sched`` (the schedule maths) imports no TensorFlow and no Horovod."""

import json
import os
import pathlib
import subprocess
import sys

_ROOT = pathlib.Path(__file__).resolve().parents[2]

_PROBE = """
import json, sys
import hvd_sched
from hvd_sched import config, momentum, policies, schedules
missing = [name for name in hvd_sched.__all__ if not hasattr(hvd_sched, name)]
heavy = sorted(name for name in sys.modules if name.split('.')[0] in ('tensorflow', 'horovod', 'keras', 'torch'))
print(json.dumps({"missing": missing, "heavy": heavy, "version": hvd_sched.__version__}))
"""


def test_import_pulls_in_no_tensorflow_or_horovod():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])))
    completed = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120,
                               cwd=_ROOT, env=env, check=True)
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["heavy"] == []
    assert result["missing"] == []
    assert result["version"]


def test_public_api():
    import hvd_sched

    for name in ("Schedule", "from_detectron", "load_solver", "linear_scaled_lr", "gradual_warmup_factor",
                 "correction_factor", "correction_factors", "__version__"):
        assert name in hvd_sched.__all__
    assert hvd_sched.__doc__ and "from_detectron" in hvd_sched.__doc__
