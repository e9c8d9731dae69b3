"""`hvd-sched show / plot / check`, run as users run it (a subprocess of `python -m hvd_sched.cli`).

Every number the command line prints is compared with the pure schedule it came from (`lr_at`,
`boundaries`, `momentum_corrections`), the PNG is read back byte by byte (size from the IHDR chunk, the marked
corrections from the text chunks `hvd_sched.plot` writes), and bad input must give exit 2 and a message, never
a traceback. No TensorFlow may be imported on the way.
"""

import importlib.metadata
import json
import pathlib
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import hvd_sched
from hvd_sched import cli, plot

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "examples" / "configs"
DETECTRON_CONFIGS = ["e2e_faster_rcnn_R-50-FPN_1x.yaml", "e2e_faster_rcnn_R-50-FPN_1x_large_batch_constant_warmup.yaml",
                     "retinanet_R-50-FPN_cosine.yaml"]
DIGITS = CONFIGS / "digits_warmup_steps.yaml"
DIGITS_ARGS = ["--world-size", "2", "--steps-per-epoch", "22"]
# (config file, extra CLI arguments, the same arguments for from_detectron)
CASES = [(CONFIGS / name, [], {}) for name in DETECTRON_CONFIGS] + [
    (DIGITS, DIGITS_ARGS, {"world_size": 2, "steps_per_epoch": 22})]
IDS = [case[0].stem for case in CASES]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "hvd_sched.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)


def section(stdout, title):
    """The table rows (split on 2+ spaces) under the line starting with `title`, up to the next blank line."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[start + 2:]:  # skip the title and the column header
        if not line.strip():
            break
        rows.append([cell for cell in line.strip().split("  ") if cell.strip()])
    return [[cell.strip() for cell in row] for row in rows]


def f32(text):
    return np.float32(float(text))


def png_chunks(path):
    data = pathlib.Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    chunks, offset = [], 8
    while offset < len(data):
        length, kind = struct.unpack(">I4s", data[offset:offset + 8])
        chunks.append((kind.decode("ascii"), data[offset + 8:offset + 8 + length]))
        offset += 12 + length
    return chunks


def png_size_and_text(path):
    chunks = png_chunks(path)
    assert chunks[0][0] == "IHDR"
    width, height = struct.unpack(">II", chunks[0][1][:8])
    text = dict(body.decode("latin-1").split("\0", 1) for kind, body in chunks if kind == "tEXt")
    return (width, height), text


@pytest.mark.parametrize("config, args, kwargs", CASES, ids=IDS)
def test_show_prints_every_phase_boundary_lr_and_correction_of_the_schedule(config, args, kwargs):
    schedule = hvd_sched.from_detectron(config, **kwargs)
    result = run_cli("show", config, *args)
    assert result.returncode == 0, result.stderr
    phases = section(result.stdout, "phases")
    assert [int(row[1]) for row in phases] == schedule.boundaries()
    assert phases[0][0].startswith("warmup") and phases[-1][0] == "end"
    for row in phases:
        start = int(row[1])
        assert f32(row[3]) == np.float32(schedule.lr_at(start)), row
        if row[2] != "-":
            assert f32(row[4]) == np.float32(schedule.lr_at(int(row[2]) - 1)), row
    expected = schedule.momentum_corrections(max(schedule.max_iter, schedule.hold_iter) + 1)
    assert f"momentum corrections: {len(expected)}," in result.stdout
    printed = section(result.stdout, "momentum corrections") if expected else []
    assert [int(row[0]) for row in printed] == [it for it, _ in expected]
    for row, (it, factor) in zip(printed, expected):
        assert (f32(row[1]), f32(row[2]), f32(row[3])) == (
            np.float32(schedule.lr_at(it - 1)), np.float32(schedule.lr_at(it)), np.float32(factor))


def test_show_of_the_large_batch_config_lists_the_warmup_jump_and_both_steps():
    result = run_cli("show", CONFIGS / DETECTRON_CONFIGS[1])
    rows = section(result.stdout, "momentum corrections")
    assert [(int(r[0]), round(float(r[3]), 4)) for r in rows] == [(1000, 10.0), (15000, 0.1), (20000, 0.1)]


def test_show_scales_by_world_size_and_needs_steps_per_epoch_for_epoch_keys():
    result = run_cli("show", DIGITS)
    assert result.returncode == 2 and "--steps-per-epoch" in result.stderr and "Traceback" not in result.stderr
    result = run_cli("show", DIGITS, "--world-size", "4", "--steps-per-epoch", "11")
    assert result.returncode == 0, result.stderr
    assert "BASE_LR 0.2," in result.stdout and "world size 4 / REFERENCE_WORLD_SIZE 1" in result.stdout


ACCUMULATING = """\
SOLVER:
  BASE_LR: 0.02
  LR_POLICY: steps_with_decay
  STEPS: [0, 600, 800]
  MAX_ITER: 900
  WARM_UP_ITERS: 100
  ITER_SIZE: 2
  REFERENCE_WORLD_SIZE: 8
"""
ACCUMULATION_LINE = ("  accumulation: ITER_SIZE 2 micro-batches per iteration (global batch = ranks x 2 x per-rank "
                     "batch; iterations count updates)")


def test_show_and_check_say_iter_size_and_scale_by_ranks_times_iter_size(tmp_path):
    config = tmp_path / "accumulating.yaml"
    config.write_text(ACCUMULATING)
    # As written: REFERENCE_WORLD_SIZE 8 counts ranks x ITER_SIZE, so 4 ranks run it unscaled.
    result = run_cli("show", config)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == (f"{config}: steps_with_decay, BASE_LR 0.02, MAX_ITER 900, linear warmup "
                                             "100 its from 0.33333334 x BASE_LR")
    assert result.stdout.splitlines()[2:5] == [
        ACCUMULATION_LINE, "  note: world size 4 (REFERENCE_WORLD_SIZE 8 / ITER_SIZE 2; pass --world-size N to scale)",
        ""]
    # 8 ranks x ITER_SIZE 2 = 16: scale 2, the schedule of 16 ranks without accumulation.
    result = run_cli("show", config, "--world-size", 8)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == (f"{config}: steps_with_decay, BASE_LR 0.04, MAX_ITER 450, linear warmup 50 its from "
                        "0.33333334 x BASE_LR")
    assert lines[2:5] == [ACCUMULATION_LINE,
                          "  note: LR scaled linearly by world size 8 x ITER_SIZE 2 / REFERENCE_WORLD_SIZE 8", ""]
    plain = tmp_path / "plain.yaml"
    plain.write_text(ACCUMULATING.replace("  ITER_SIZE: 2\n", ""))
    sixteen = run_cli("show", plain, "--world-size", 16)
    assert "accumulation" not in sixteen.stdout
    assert section(result.stdout, "phases") == section(sixteen.stdout, "phases") == [
        ["warmup (linear)", "0", "50", "0.013333334", "0.039466668"], ["step 0", "50", "300", "0.04", "0.04"],
        ["step 1", "300", "400", "0.004", "0.004"], ["step 2", "400", "450", "0.0004", "0.0004"],
        ["end", "450", "-", "0.0004", "-"]]
    assert section(result.stdout, "momentum corrections") == section(sixteen.stdout, "momentum corrections")
    result = run_cli("check", config, "--world-size", 2)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"OK {config}: steps_with_decay, BASE_LR 0.01, linear warmup 200 its, steps at [1200, 1600], MAX_ITER 1800, "
        "ITER_SIZE 2 micro-batches per iteration, 2 momentum corrections (LR scaled linearly by world size 2 x "
        "ITER_SIZE 2 / REFERENCE_WORLD_SIZE 8)"]


def test_show_notes_the_scaling_when_no_rank_count_runs_the_config_as_written(tmp_path):
    config = tmp_path / "odd.yaml"
    config.write_text(ACCUMULATING.replace("REFERENCE_WORLD_SIZE: 8", "REFERENCE_WORLD_SIZE: 1"))
    result = run_cli("show", config)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[2:6] == [
        ACCUMULATION_LINE, "  note: world size 1 (REFERENCE_WORLD_SIZE; pass --world-size N to scale)",
        "  note: LR scaled linearly by world size 1 x ITER_SIZE 2 / REFERENCE_WORLD_SIZE 1", ""]
    assert "BASE_LR 0.04, MAX_ITER 450," in result.stdout


def test_check_lists_a_bad_iter_size_with_the_other_problems(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("SOLVER:\n  BASE_LR: -1\n  ITER_SIZE: 0\n")
    result = run_cli("check", config)
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [f"hvd-sched check: {config}: 2 problems:",
                                          "  - ITER_SIZE must be >= 1, got 0", "  - BASE_LR must be > 0, got -1"]
    config.write_text("SOLVER:\n  ITER_SIZE: 1.5\n")
    result = run_cli("show", config)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"hvd-sched show: error: {config}: ITER_SIZE must be an int, got 1.5 (float)"]


@pytest.mark.parametrize("config, args, kwargs", CASES, ids=IDS)
def test_plot_writes_a_png_of_the_requested_size_marking_the_schedule_corrections(tmp_path, config, args, kwargs):
    out = tmp_path / "lr.png"
    result = run_cli("plot", config, *args, "-o", out, "--width", 640, "--height", 320, "--log")
    assert result.returncode == 0, result.stderr
    size, text = png_size_and_text(out)
    assert size == (640, 320)
    schedule = hvd_sched.from_detectron(config, **kwargs)
    expected = schedule.momentum_corrections(plot.plot_end(schedule) + 1)
    assert [tuple(pair) for pair in json.loads(text["hvd_sched:corrections"])] == expected
    assert json.loads(text["hvd_sched:warmup"]) == [0, schedule.warm_up_iters]
    assert hvd_sched.Schedule.from_config(json.loads(text["hvd_sched:schedule"])) == schedule
    assert f"{len(expected)} momentum corrections marked" in result.stdout


def test_plot_default_size_and_the_marks_are_the_schedule_corrections(tmp_path):
    result = run_cli("plot", CONFIGS / DETECTRON_CONFIGS[0], "-o", tmp_path / "a.png")
    assert result.returncode == 0, result.stderr
    assert png_size_and_text(tmp_path / "a.png")[0] == (1000, 500)
    schedule = hvd_sched.from_detectron(CONFIGS / DETECTRON_CONFIGS[0])
    assert plot.correction_marks(schedule) == schedule.momentum_corrections(90001) == [
        (60000, pytest.approx(0.1, rel=1e-6)), (80000, pytest.approx(0.1, rel=1e-6))]
    iterations, lrs = plot.lr_curve(schedule)
    assert np.array_equal(lrs, schedule.lr_at(iterations)) and iterations[-1] == 90000
    assert {59999, 60000, 79999, 80000, 499, 500} <= set(iterations.tolist())  # every jump drawn where it is


@pytest.mark.parametrize("config", [CONFIGS / name for name in DETECTRON_CONFIGS] + [DIGITS], ids=lambda p: p.stem)
def test_check_accepts_every_example_config_unchanged(config):
    result = run_cli("check", config)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1 and result.stdout.startswith(f"OK {config}")
    hvd_sched.from_detectron(config, steps_per_epoch=22, world_size=2)  # the library agrees


def test_check_lists_every_problem_with_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(textwrap.dedent("""\
        MODEL: {TYPE: generalized_rcnn}
        SOLVER:
          BASE_LR: -1
          LR_POLCY: steps_with_decay
          GAMMA: 0
          WARM_UP_METHOD: quadratic
          MAX_ITER: 1.5
        """))
    result = run_cli("check", bad)
    assert result.returncode == 2 and result.stdout == ""
    assert "5 problems" in result.stderr and "Traceback" not in result.stderr
    for expected in ("'LR_POLCY'; did you mean 'LR_POLICY'", "BASE_LR must be > 0, got -1", "GAMMA must be > 0",
                     "MAX_ITER must be an int, got 1.5", "WARM_UP_METHOD 'quadratic'"):
        assert expected in result.stderr


def test_collect_problems_reports_a_consequence_once():
    # STEPS is wrong; LR_POLICY then has no STEPS, which is the same problem and must not be listed again.
    _, problems = cli.collect_problems({"LR_POLICY": "steps_with_decay", "STEPS": [5, 3], "WARM_UP_FACTOR": 2})
    assert len(problems) == 2, problems
    assert any("STEPS must start at 0" in p for p in problems) and any("WARM_UP_FACTOR" in p for p in problems)
    schedule, problems = cli.collect_problems({"BASE_LR": 0.1})
    assert problems == [] and schedule == hvd_sched.from_detectron({"BASE_LR": 0.1})


BAD_INPUTS = {
    "missing": (None, "cannot read"),
    "malformed": ("SOLVER:\n  BASE_LR: 0.1\n   LR_POLICY: step\n", "line 3"),
    "invalid": ("SOLVER:\n  BASE_LR: zero\n", "BASE_LR must be a number"),
    "not-a-mapping": ("SOLVER: [1, 2]\n", "must be a mapping"),
    "not-utf8": (b"\xff\xfe\x00", "not UTF-8"),
}


@pytest.mark.parametrize("command", ["show", "plot", "check"])
@pytest.mark.parametrize("kind", sorted(BAD_INPUTS))
def test_bad_input_is_one_clear_message_and_exit_2_never_a_traceback(tmp_path, command, kind):
    content, expected = BAD_INPUTS[kind]
    path = tmp_path / f"{kind}.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    extra = ["-o", tmp_path / "x.png"] if command == "plot" else []
    result = run_cli(command, path, *extra)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and expected in result.stderr and str(path) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.png").exists()


def test_usage_errors_and_unwritable_output_exit_2_without_traceback(tmp_path):
    for args in ([], ["show"], ["frobnicate", DIGITS], ["plot", DIGITS]):
        result = run_cli(*args)
        assert result.returncode == 2 and "usage:" in result.stderr and "Traceback" not in result.stderr
    result = run_cli("plot", CONFIGS / DETECTRON_CONFIGS[0], "-o", tmp_path / "no" / "such" / "dir.png")
    assert result.returncode == 2 and "cannot write" in result.stderr and "Traceback" not in result.stderr
    assert run_cli("--help").returncode == 0


def test_the_command_line_imports_no_tensorflow(tmp_path):
    probe = textwrap.dedent(f"""
        import json, sys
        from hvd_sched import cli
        loaded = {{}}
        for command in (["check", {str(DIGITS)!r}], ["show", {str(CONFIGS / DETECTRON_CONFIGS[0])!r}],
                        ["plot", {str(CONFIGS / DETECTRON_CONFIGS[0])!r}, "-o", {str(tmp_path / "p.png")!r}]):
            assert cli.main(command) == 0, command
            loaded[command[0]] = sorted({{m.split(".")[0] for m in sys.modules}})
        print(json.dumps(loaded))
    """)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.splitlines()[-1])
    for command, modules in loaded.items():
        assert not {"tensorflow", "keras", "horovod", "tf_keras"} & set(modules), command
    assert "matplotlib" not in loaded["show"] and "matplotlib" in loaded["plot"]  # imported only to plot


def test_console_script_points_at_main():
    # The installed distribution's entry point (an editable install and the wheel alike), as pip wrote it.
    [script] = [entry for entry in importlib.metadata.entry_points(group="console_scripts") if entry.name == "hvd-sched"]
    assert script.value == "hvd_sched.cli:main"
    assert cli.main(["check", str(DIGITS)]) == cli.EXIT_OK
