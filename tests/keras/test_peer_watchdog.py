"""TrainingCheckpoint's peer_timeout (the heartbeat between ranks, hvd_sched/keras/_watchdog.py): its checks, and
that one process keeps one heartbeat. The heartbeat itself, across hosts that die, freeze or are cut off, is
tested for real in tests/multirank/test_nodes.py and test_slurm_requeue.py."""

import pytest

import hvd_sched.keras as hk
from hvd_sched.keras import _watchdog


@pytest.mark.parametrize("value", [0, 0.5, -1, float("inf"), True, "60"])
def test_a_peer_timeout_that_is_not_a_number_of_seconds_is_refused_naming_it(tmp_path, value):
    with pytest.raises(ValueError, match=r"peer_timeout must be a number of seconds >= 1 \(or None: no "
                                         r"heartbeat\), got"):
        hk.TrainingCheckpoint(tmp_path, peer_timeout=value)


def test_the_defaults_and_the_status():
    assert hk.PEER_LOST_STATUS == 75 and hk.PEER_LOST_STATUS not in (128 + 15, 128 + 10, 128 + 2)
    assert hk.TrainingCheckpoint("x").peer_timeout == 60.0
    assert hk.TrainingCheckpoint("x", peer_timeout=None).peer_timeout is None
    assert hk.EpochCheckpoint("x", peer_timeout=5).peer_timeout == 5.0


def test_one_heartbeat_per_process_takes_the_newest_fit_s_timeout():
    first = _watchdog.shared(60, None)
    second = _watchdog.shared(10, None)
    assert first is second and second.timeout == 10 and second.interval == 0.5
    assert all(address.count(".") == 3 for address in _watchdog.local_addresses())


def test_in_a_partition_the_note_of_the_ranks_that_hear_rank_0_wins(tmp_path):
    """A cut link leaves both sides running and both may write the shared note: the side that lost rank 0 keeps a
    note of this job's (written since its start) and writes its own only where there is none, or an old one."""
    import os
    import time

    note = tmp_path / "ckpt" / "peer_lost.txt"
    started = time.time()
    _watchdog._write_note(str(note), "rank 1 lost (rank 0's view)\n")
    _watchdog._write_note(str(note), "rank 0 lost (rank 1's view)\n", first_only=True, since=started)
    assert note.read_text() == "rank 1 lost (rank 0's view)\n"
    os.utime(note, (started - 3600, started - 3600))  # a note of an earlier run
    _watchdog._write_note(str(note), "rank 0 lost (rank 1's view)\n", first_only=True, since=started)
    assert note.read_text() == "rank 0 lost (rank 1's view)\n"
    _watchdog._write_note(str(note), "rank 1 lost (rank 0's view)\n")  # rank 0's side always writes
    assert note.read_text() == "rank 1 lost (rank 0's view)\n"
    assert sorted(p.name for p in note.parent.iterdir()) == ["peer_lost.txt"]


def test_supervise_exits_with_the_ranks_status_and_reads_their_note():
    """hvd_sched.supervise (standard library only) repeats the two values rather than import TensorFlow."""
    from hvd_sched import supervise
    from hvd_sched.keras.checkpoint import PEER_LOST_NOTE

    assert supervise.PEER_LOST_STATUS == hk.PEER_LOST_STATUS and supervise.NOTE == PEER_LOST_NOTE
