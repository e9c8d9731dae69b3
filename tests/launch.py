"""Launching real `horovodrun` jobs from tests: the command, the environment, and collecting each rank's result.

A module of its own (not conftest.py) so test files can import it: several conftest.py files exist under
tests/, and `from conftest import ...` would pick whichever was imported last.
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
#: The output files of the current test's launches (tests/conftest.py shows their tails when the test fails or
#: times out, and clears the list before each test).
OUTPUTS = []


def register_output(*paths):
    """Show these files' tails if the current test fails (a launch's stdout and stderr)."""
    OUTPUTS.extend(str(path) for path in paths)


#: Processes a fixture keeps across tests (its daemons, e.g. tests/netns.py's sshd): the guard does not kill them
#: at the end of the test call that (re)started them.
KEPT = set()
#: Callables that remove what a fixture made outside this process tree (network namespaces, links): the guard calls
#: them where a fixture's teardown cannot run (its backstop, SIGTERM) and at the session's end. Each removes itself
#: when its fixture's teardown has run.
CLEANUPS = []


def run_cleanups():
    """Call every registered cleanup (each at most once), whatever the others raise."""
    while CLEANUPS:
        cleanup = CLEANUPS.pop()
        try:
            cleanup()
        except Exception as exc:  # noqa: BLE001 (the others must run too)
            sys.stderr.write(f"cleanup {cleanup!r} failed: {exc}\n")


def rank_env(out_dir, extra=None):
    env = dict(os.environ)
    env["HVD_SCHED_TEST_OUT"] = str(out_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TESTS), env.get("PYTHONPATH", "")])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    # Each rank gets one intra-op thread: two ranks share two cores, and results must not depend on threading.
    env.setdefault("TF_NUM_INTRAOP_THREADS", "1")
    env.setdefault("TF_NUM_INTEROP_THREADS", "1")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def horovodrun_cmd(np_, script, args=()):
    """The command a user types: `horovodrun -np N -H localhost:N --gloo python script ...`."""
    horovodrun = pathlib.Path(sys.executable).with_name("horovodrun")
    return [str(horovodrun), "-np", str(np_), "-H", f"localhost:{np_}", "--gloo",
            sys.executable, str(script), *map(str, args)]


class RankFailure(AssertionError):
    pass


def run_and_collect(cmd, out_dir, np_, timeout, env_extra, expect_results=True):
    """Run `cmd` (bounded by `timeout`, killing its whole process group) and read rank0..rank{np_-1}.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    proc = run_command(cmd, out_dir, env_extra, timeout)
    results = []
    missing = []
    for rank in range(np_):
        path = out_dir / f"rank{rank}.json"
        if path.exists():
            results.append(json.loads(path.read_text()))
        else:
            missing.append(rank)
    if proc.returncode != 0 or (expect_results and missing):
        raise RankFailure(f"{' '.join(cmd)} exited {proc.returncode}; ranks without a result: {missing}\n"
                          f"--- stdout (all ranks) ---\n{proc.stdout[-20000:]}\n"
                          f"--- stderr (all ranks) ---\n{proc.stderr[-20000:]}")
    return results, proc


def run_dropping_when_held(cmd, out_dir, env, drop, hold_at, reach_timeout, finish_timeout):
    """Run an elastic job (cwd `out_dir`); once it writes an iteration >= `hold_at` to OUT/progress (the job then
    holds until Horovod notifies it), create the file `drop`, which the job's host discovery script reads to drop
    a slot or a host. Returns (returncode, the iteration read, stdout, stderr); raises RankFailure with the output
    where the job ends or `reach_timeout` passes before `hold_at`. The whole process group is killed on the way out.
    """
    progress = out_dir / "progress"
    stdout_path, stderr_path = out_dir / "stdout.txt", out_dir / "stderr.txt"
    register_output(stdout_path, stderr_path)
    with open(stdout_path, "w") as out, open(stderr_path, "w") as err:
        proc = subprocess.Popen(cmd, env=env, cwd=str(out_dir), stdout=out, stderr=err, start_new_session=True)
        try:
            deadline = time.time() + reach_timeout
            while time.time() < deadline and proc.poll() is None:
                if progress.exists() and progress.read_text() and int(progress.read_text()) >= hold_at:
                    held_at = int(progress.read_text())
                    drop.touch()
                    break
                time.sleep(0.05)
            else:
                raise RankFailure(f"the job did not reach iteration {hold_at}:\n"
                                  + (stdout_path.read_text() + stderr_path.read_text())[-6000:])
            returncode = proc.wait(timeout=finish_timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return returncode, held_at, stdout_path.read_text(), stderr_path.read_text()


#: The demo's first line and each rank's last (`make demo`: examples/train_keras.py, digits_warmup_steps.yaml, 8 epochs).
DEMO_HEADER = "hvd_sched example: 2 ranks, 718 samples and 22 steps per epoch per rank"
DEMO_FINAL = re.compile(r"rank (\d+): final val accuracy ([0-9.]+) \(360 samples, iteration (\d+)\)")


def check_demo_output(output):
    """The demo's header, and both ranks' final line: 0.9694 at iteration 176, whatever launched it."""
    assert DEMO_HEADER in output, output[-4000:]
    finals = {int(rank): (float(acc), int(it)) for rank, acc, it in DEMO_FINAL.findall(output)}
    assert finals == {0: (0.9694, 176), 1: (0.9694, 176)}, output[-4000:]


def mpi_env():
    """What an MPI launch needs from the test's environment: this environment's bin/ first on PATH (its `mpirun`,
    the Open MPI that Horovod was built against; `horovodrun --mpi` calls `mpirun` from PATH) and, where the tests
    run as root (CI containers), Open MPI's consent to that (its documented variables; users pass
    `--allow-run-as-root`)."""
    env = {"PATH": os.pathsep.join([str(pathlib.Path(sys.executable).parent), os.environ.get("PATH", "")])}
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def mpirun_cmd(np_, script, args=()):
    """The command a user types: `mpirun -np N python script ...` (this environment's mpirun)."""
    mpirun = pathlib.Path(sys.executable).with_name("mpirun")
    return [str(mpirun), "-np", str(np_), sys.executable, str(script), *map(str, args)]


def horovodrun_mpi_cmd(np_, script, args=()):
    """The command a user types: `horovodrun --mpi -np N -H localhost:N python script ...`."""
    horovodrun = pathlib.Path(sys.executable).with_name("horovodrun")
    return [str(horovodrun), "--mpi", "-np", str(np_), "-H", f"localhost:{np_}",
            sys.executable, str(script), *map(str, args)]


def mpi_missing():
    """Why MPI launches cannot run here (a reason for pytest.skip), or None: Horovod built without MPI
    (HVD_SCHED_MPI=0) or no mpirun next to this Python."""
    import hvd_sched._compat  # noqa: F401  (before Horovod)
    import horovod.tensorflow as hvd

    if not hvd.mpi_built():
        return "this Horovod was built without MPI (HVD_SCHED_MPI=0); `horovodrun --check-build` shows no [X] MPI"
    if not pathlib.Path(sys.executable).with_name("mpirun").exists():
        return f"no mpirun next to {sys.executable} (Horovod was built against an MPI outside this environment)"
    return None


def run_command(cmd, cwd, env_extra=None, timeout=300):
    """Run `cmd` in `cwd` (its own process group, killed whole on timeout) with the ranks' environment; returns the
    CompletedProcess (stdout and stderr as text, also kept in cwd/stdout.txt and stderr.txt). A timeout raises
    RankFailure with the output so far."""
    stdout_path, stderr_path = pathlib.Path(cwd) / "stdout.txt", pathlib.Path(cwd) / "stderr.txt"
    register_output(stdout_path, stderr_path)
    with open(stdout_path, "w") as out, open(stderr_path, "w") as err:
        # A new session, so a hang kills the launcher *and* every rank it started.
        proc = subprocess.Popen(cmd, env=rank_env(cwd, env_extra), cwd=str(cwd), stdout=out, stderr=err, text=True,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RankFailure(f"{' '.join(map(str, cmd))} did not finish within {timeout}s\n--- stdout ---\n"
                              f"{stdout_path.read_text()[-20000:]}\n--- stderr ---\n"
                              f"{stderr_path.read_text()[-20000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout_path.read_text(), stderr_path.read_text())


# --- stopped and resumed jobs (tests/multirank/test_preemption.py, test_slurm_requeue.py) --------------------------

#: Rank 0's line when TrainingCheckpoint stops a job at a signal.
STOPPED = re.compile(r"hvd_sched: (SIG\w+): every rank stopped at iteration (\d+) \(step (\d+) of epoch (\d+)\); "
                     r"saved (\S+) in ([0-9.]+) s; exiting with status (\d+)")


def latest_meta(out):
    """The newest checkpoint's metadata in OUT/ckpt, or None (read as a user would: the `latest` pointer, then
    meta.json)."""
    try:
        name = (out / "ckpt" / "latest").read_text().strip()
        return json.loads((out / "ckpt" / name / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def _checkpoint_variables(path):
    """Every variable of a checkpoint, by its checkpoint key."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(path))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if not name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH")}


def assert_same_final_checkpoint(out, reference_out, epochs, steps_per_epoch):
    """OUT's newest checkpoint is the end of the last epoch, and it holds exactly the variables (weights, slots,
    iteration) of the reference run's, bit for bit."""
    import numpy as np

    total = epochs * steps_per_epoch
    final, expected = latest_meta(out), latest_meta(reference_out)
    assert (final["epoch"], final["step"], final["iteration"]) == (epochs - 1, steps_per_epoch, total) == \
        (expected["epoch"], expected["step"], expected["iteration"])
    last = f"epoch-{epochs - 1:04d}"
    ours = _checkpoint_variables(out / "ckpt" / last / "ckpt")
    theirs = _checkpoint_variables(reference_out / "ckpt" / last / "ckpt")
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)


def processes_naming(path):
    """Live processes (on any host of tests/netns.py: the namespaces share this machine's pids), other than this
    one, whose command line names `path` (a job's OUT folder): [(pid, the start of its command line)]."""
    needle = str(path).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                words = handle.read()
        except OSError:
            continue
        if needle in words:
            found.append((int(entry), words.replace(b"\0", b" ")[:200].decode(errors="replace")))
    return found


def run_during(cmd, env, cwd, timeout, during=None):
    """Run `cmd` in `cwd` (its own session, killed whole past `timeout`; its output in cwd/output.txt);
    `during(proc)` is called while it runs and may return the time a fault happened, from which `timeout` then
    counts. Returns (returncode, output, fault time, end time); a run past its bound fails the test with its
    output."""
    import pytest

    cwd.mkdir(parents=True, exist_ok=True)
    log = cwd / "output.txt"
    register_output(log)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=str(cwd), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        faulted = None
        try:
            if during is not None:
                faulted = during(proc)
            proc.wait(timeout=timeout if faulted is None else max(timeout - (time.monotonic() - faulted), 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"{' '.join(map(str, cmd))} hung: not ended {timeout} s after "
                        f"{'the fault' if faulted else 'its start'}:\n{log.read_text()[-6000:]}")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return proc.returncode, log.read_text(), faulted, time.monotonic()


def when_checkpoint_reaches(out, iteration, action, proc, limit=300):
    """Call `action()` once OUT's newest checkpoint is at `iteration` or later; returns the time it was called, or
    None when `proc` ended first. The test fails when neither happens within `limit` s."""
    import pytest

    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        meta = latest_meta(out)
        if meta is not None and meta["iteration"] >= iteration:
            action()
            return time.monotonic()
        if proc.poll() is not None:
            return None
        time.sleep(0.05)
    pytest.fail(f"the job did not reach iteration {iteration} in {limit} s")


# --- the Kubernetes MPIJob's launcher (examples/kubernetes/mpijob.yaml) --------------------------------------------

MPIJOB = ROOT / "examples" / "kubernetes" / "mpijob.yaml"
#: What mpi-operator v2 sets in the launcher container for Open MPI (its constants: OpenMPIEnvHostFileLocation,
#: OpenMPIEnvKeyRSHArgs, OpenMPIEnvKeepFQDNHostNames, OpenMPIEnvDefaultSlots); the hostfile's path is filled in.
MPIJOB_OPERATOR_ENV = {"OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10", "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                       "OMPI_MCA_orte_set_default_slots": "1"}


def mpijob():
    """The manifest: (its launcher's shell script, the MPIJob's spec)."""
    import yaml

    [job] = yaml.safe_load_all(MPIJOB.read_text())
    [container] = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["bash", "-c"], container["command"]
    return container["command"][2], job["spec"]


def mpijob_launcher_script(out, hostfile, demo_args=None, extra_args=()):
    """The MPIJob launcher's shell script as written, with this machine's paths: this environment's Python and
    mpirun, the repository's example, OUT for /tmp/run, `hostfile` for the operator's /etc/mpi/hostfile; the demo's
    arguments replaced by `demo_args` (all but --resume and --out) where given, `extra_args` added."""
    script, _ = mpijob()
    line = re.compile(r"^python -m hvd_sched\.supervise --checkpoint-dir /tmp/run/ckpt -- mpirun "
                      r"--allow-run-as-root --hostfile /etc/mpi/hostfile python examples/train_keras.py "
                      r"(.*) --resume --out /tmp/run &$", re.MULTILINE)
    found = line.search(script)
    assert found, script
    args = found.group(1).split() if demo_args is None else [str(arg) for arg in demo_args]
    args = [str(ROOT / arg) if arg.startswith("examples/") else arg for arg in args]
    mpirun = pathlib.Path(sys.executable).with_name("mpirun")
    command = [sys.executable, "-m", "hvd_sched.supervise", "--checkpoint-dir", f"{out}/ckpt", "--", str(mpirun),
               "--allow-run-as-root", "--hostfile", str(hostfile), sys.executable, str(ROOT / "examples" /
               "train_keras.py"), *args, *map(str, extra_args), "--resume", "--out", str(out), "&"]
    script = script[:found.start()] + " ".join(command) + script[found.end():]
    assert script.count("/etc/mpi/hostfile") == 1, script  # the wait for the workers reads it too
    return ["bash", "-c", script.replace("/etc/mpi/hostfile", str(hostfile))]
