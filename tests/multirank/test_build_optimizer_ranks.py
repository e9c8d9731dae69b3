"""build_optimizer under real `horovodrun -np 2 --gloo`: 2 ranks x half batch end with identical weights, equal
(1e-5) to one process on the full batch and to the numpy re-derivation of Caffe2's per-parameter update."""

import pathlib

import numpy as np
import pytest

pytestmark = pytest.mark.multirank

JOB = pathlib.Path(__file__).with_name("build_optimizer_job.py").read_text()


def test_two_ranks_equal_one_process_and_the_caffe2_reference(run_ranks, run_single):
    ranks = run_ranks(JOB, np=2, args=["ranks"])
    single = run_single(JOB, args=["single"])
    assert ranks[0]["iterations"] == ranks[1]["iterations"] == single["iterations"] == 12
    assert ranks[0]["class"] == "ScheduledSGD"
    assert ranks[0]["describe"] == \
        "weight decay 0.01 on 3 kernels, 0 on 5 biases at 2x LR (2 norm shifts), 0.005 on 2 norm scales"
    diffs = {"ranks_vs_single": 0.0, "ranks_vs_reference": 0.0, "single_vs_reference": 0.0}
    for w0, w1, ws, ref in zip(ranks[0]["weights"], ranks[1]["weights"], single["weights"], single["reference"]):
        w0, w1, ws, ref = map(np.array, (w0, w1, ws, ref))
        np.testing.assert_array_equal(w0, w1)
        diffs["ranks_vs_single"] = max(diffs["ranks_vs_single"], float(np.abs(w0 - ws).max()))
        diffs["ranks_vs_reference"] = max(diffs["ranks_vs_reference"], float(np.abs(w0 - ref).max()))
        diffs["single_vs_reference"] = max(diffs["single_vs_reference"], float(np.abs(ws - ref).max()))
    print(diffs)
    assert max(diffs.values()) < 1e-5, diffs
