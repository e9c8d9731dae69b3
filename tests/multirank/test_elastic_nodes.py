"""Elastic Horovod across hosts of their own (tests/netns.py): `horovodrun --gloo -np 2 --min-np 1 --max-np 2
--host-discovery-script ...` from this machine (a login node) over ssh to two hosts, one rank on each; the second
host dies mid-training (its link down, every process of it killed: nothing answers, no TCP reset), and the
discovery script stops listing it, as a cluster's node list drops a dead node.

The survivor goes on by itself at world size 1 with ElasticLRScaler's rule (the LR scaled to the new world size,
the momentum slots by new_lr/old_lr at the reset, the iteration kept), writes checkpoints as it goes, and ends;
then the job is launched again on both hosts (the dead one replaced) and resumes from the survivor's last
checkpoint with `restore_latest(..., lr_rule="linear")` (the LR scaled back to 2 ranks, the slots by 2).

Checked against tests/reference.py, numpy's Detectron MomentumSGD in float64, re-deriving the whole run from the
initial weights: 2 ranks' averaged gradient and Detectron's LR for 2 ranks (BASE_LR 0.1) up to the reset's
iteration, then the survivor's own gradient at half that LR with the momentum halved at the reset, then both ranks
again at the full LR with the momentum doubled at the resume; Detectron's scheduled momentum corrections all
along. Each rank trains on rows of its own, the same at every step (elastic_nodes_job.py), so the re-derivation
knows every update whatever batch an elastic restart of `fit` takes. The same run without the slot rescale, or
without the LR scaling, is 100x the tolerance away.

Default row only (tests/rows.py: the launcher and the hosts; the elastic rule on Keras 3's path is
test_elastic.py's, on one host); bounded (600 s).
"""

import json
import os
import pathlib
import sys
import time

import numpy as np
import pytest

from launch import latest_meta, processes_naming, rank_env, run_during
from netns import Hosts
from reference import detectron_corrections, detectron_lr, train_detectron_sgd
import rankutil

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(600)]

JOB = pathlib.Path(__file__).with_name("elastic_nodes_job.py")
STEPS, BATCH, HOLD_AT = 20, 8, 25  # elastic_nodes_job.py's
ELASTIC_EPOCHS, EPOCHS = 3, 4  # the elastic launch's epochs, then the relaunch's (one more)
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    reason = Hosts.missing()
    if reason:
        pytest.skip(reason)
    with Hosts(tmp_path_factory.mktemp("hosts"), count=2) as made:
        yield made


def _env(hosts, out, phase, epochs):
    env = rank_env(out, {"HVD_SCHED_TEST_PHASE": phase, "HVD_SCHED_TEST_EPOCHS": str(epochs)})
    env["PATH"] = os.pathsep.join([str(hosts.ssh_bin), env["PATH"]])
    return env


def _horovodrun(hosts, *args):
    horovodrun = pathlib.Path(sys.executable).with_name("horovodrun")
    return [str(horovodrun), "--gloo", *args, "-p", "22", "--ssh-identity-file", str(hosts.ssh_key),
            "--network-interface", hosts.interface, sys.executable, str(JOB)]


def _weights(path):
    with np.load(path) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def test_elastic_goes_on_without_a_dead_host_under_the_lr_rule_and_its_checkpoint_resumes(hosts, tmp_path):
    first, second = hosts.names
    out = tmp_path / "out"
    out.mkdir()
    drop = tmp_path / "DROP"
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\necho {hosts.address(first)}:1\n[ -f {drop} ] || echo {hosts.address(second)}:1\n")
    discover.chmod(0o755)

    def kill_when_held(proc):
        deadline = time.monotonic() + 240
        while not (out / "held").exists():
            if proc.poll() is not None:
                return None
            assert time.monotonic() < deadline, "the job did not reach the iteration to hold at"
            time.sleep(0.05)
        hosts.kill(second)
        drop.write_text("")
        (out / "KILLED").write_text("")
        return time.monotonic()

    elastic = _horovodrun(hosts, "-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script",
                          str(discover))
    try:
        code, output, killed, ended = run_during(elastic, _env(hosts, out, "elastic", ELASTIC_EPOCHS),
                                                 tmp_path / "elastic", 300, kill_when_held)
    finally:
        hosts.restore(second)
    assert killed is not None and code == 0, output[-8000:]
    assert not processes_naming(out), processes_naming(out)
    survivor = json.loads((out / "elastic-rank0.json").read_text())
    assert not (out / "elastic-rank1.json").exists()  # the dead host's rank never finished
    assert (survivor["host"], survivor["start_size"], survivor["final_size"]) == (first, 2, 1), survivor
    [reset] = survivor["resets"]
    # The reset restores the state committed at the end of HOLD_AT: the survivor runs HOLD_AT + 1 on, alone.
    reset_at, end = reset["iteration"], survivor["final_iteration"]
    assert reset_at == HOLD_AT + 1 and (reset["world_size"], reset["scale"], reset["slot_factor"]) == (1, 0.5, 0.5)
    assert end >= ELASTIC_EPOCHS * STEPS - STEPS and survivor["lr_scale"] == 0.5, survivor
    saved = latest_meta(out)
    assert (saved["iteration"], saved["world_size"]) == (end, 1), saved

    # Launched again on both hosts: the survivor's checkpoint resumes at 2 ranks.
    resume = _horovodrun(hosts, "-np", "2", "-H", f"{hosts.address(first)}:1,{hosts.address(second)}:1")
    code, output, _, _ = run_during(resume, _env(hosts, out, "resume", EPOCHS), tmp_path / "resume", 300)
    assert code == 0, output[-8000:]
    ranks = [json.loads((out / f"resume-rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["host"] for r in ranks] == [first, second]
    for record in ranks:
        assert record["resumed"] == {"iteration": end, "epoch": saved["epoch"], "step": saved["step"],
                                     "world_size": 1, "slot_factor": 2.0}, record
        assert (record["final_size"], record["lr_scale"]) == (2, 1.0), record
    final = ranks[0]["final_iteration"]
    assert final == end + STEPS * (EPOCHS - saved["epoch"] - 1) and ranks[1]["final_iteration"] == final
    weights = [_weights(out / f"resume-rank{r}.npz") for r in (0, 1)]
    for mine, theirs in zip(*weights):
        np.testing.assert_array_equal(mine, theirs)  # the ranks end equal, to the bit

    # numpy's Detectron over the whole run.
    solver = survivor["solver"]
    assert solver["BASE_LR"] == 0.1  # the linear scaling rule: 0.05 per rank, for the 2 ranks it started with
    x, y = rankutil.make_regression(n=2 * BATCH, seed=3)
    # The 2 ranks' rows (their averaged gradient), then the survivor's: those of the rank it started as (Horovod
    # numbers the hosts of an elastic job in an order of its own: the first host's rank was 1 in one run of two).
    mine = slice(survivor["start_rank"] * BATCH, (survivor["start_rank"] + 1) * BATCH)
    both, alone = (x, y), (x[mine], y[mine])
    initial = _weights(out / "initial.npz")

    def reference(scale_lr=True, rescale_slots=True):
        world = [1 if reset_at <= it < end else 2 for it in range(final)]
        lrs = [np.float32(detectron_lr(it, solver)) * np.float32(size / 2 if scale_lr else 1) for it, size
               in enumerate(world)]
        corrections = detectron_corrections(final, solver)
        if rescale_slots:
            for it, factor in ((reset_at, 0.5), (end, 2.0)):
                corrections[it] = np.float32(corrections.get(it, 1.0)) * np.float32(factor)
        batches = [alone if size == 1 else both for size in world]
        return train_detectron_sgd(initial, batches, lrs, corrections, momentum=0.9)

    expected = reference()
    for got, want in zip(weights[0], expected):
        np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE)
    def apart(these, those):
        return max(float(np.max(np.abs(a - b))) for a, b in zip(these, those))

    wrong = [apart(reference(rescale_slots=False), expected), apart(reference(scale_lr=False), expected)]
    assert min(wrong) > 100 * TOLERANCE, wrong
    print(f"test_elastic_nodes: host killed at iteration {HOLD_AT}, world 1 from iteration {reset_at} (the elastic "
          f"job ended {ended - killed:.1f} s after the kill, at {end}), resumed on 2 ranks to {final}; "
          f"{apart(weights[0], expected):.2e} from numpy's Detectron, which without the slot rescale moves by "
          f"{wrong[0]:.3g} and without the LR scaling by {wrong[1]:.3g}")
