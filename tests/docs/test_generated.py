"""The documentation's generated content (scripts/docs_hooks/generated.py and figures.py), without mkdocs.

The hook's generation is plain functions; mkdocs is imported only inside its event functions, so the module is
loaded here by path in the test environments (which have no mkdocs). Each generated fact is checked against its
one source: scripts/stack.sh for the versions, hvd_sched.dialects for the SOLVER keys, the program for its help,
docs/bench/*.json for the figures. Nothing is written into the tree (figures are drawn in memory).
"""

import importlib.util
import inspect
import json
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import hvd_sched
from hvd_sched import dialects


ROOT = pathlib.Path(__file__).resolve().parents[2]
HOOKS = ROOT / "scripts" / "docs_hooks"
BENCH = ROOT / "docs" / "bench"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_test_docs_{name}", HOOKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generated = _load("generated")


def _stack(*args):
    return subprocess.run(["bash", str(ROOT / "scripts" / "stack.sh"), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_module_imports_no_mkdocs():
    source = (HOOKS / "generated.py").read_text() + (HOOKS / "figures.py").read_text()
    top_level = [line for line in source.splitlines() if re.match(r"^(import|from) ", line)]
    assert not [line for line in top_level if "mkdocs" in line or "matplotlib" in line], top_level


def test_versions_table_has_every_row_with_the_pins_stack_sh_resolves():
    table = generated.versions_markdown(ROOT)
    lines = [line for line in table.splitlines() if line.startswith("| `")]
    rows = _stack("--list").split()
    assert len(lines) == len(rows) and "(default)" in lines[0] and rows[0] in lines[0]
    for row, line in zip(rows, lines):
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert cells[0].startswith(f"`{row}`")
        assert cells[1] == _stack(row, "PYTHON_VERSION")
        assert cells[2] == _stack(row, "TENSORFLOW_CPU_VERSION")
        assert cells[4] == _stack(row, "HOROVOD_VERSION")
        assert cells[6] == f"`{_stack(row, 'NUMPY_SPEC')}`"
        assert cells[7] == ("yes" if _stack(row, "HOROVOD_NO_XLA") == "1" else "no")
        if _stack(row, "LEGACY_KERAS") == "1":
            assert cells[3] == f"tf-keras {_stack(row, 'TF_KERAS_VERSION')} (`TF_USE_LEGACY_KERAS=1`)"
        elif _stack(row, "KERAS_VERSION"):
            assert cells[3] == f"Keras 3 ({_stack(row, 'KERAS_VERSION')})"
        else:
            assert cells[3] == "Keras 2 (built in)"


def test_versions_rows_override_only_what_stack_sh_lets_them(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "stack.sh", tmp_path / "scripts" / "stack.sh")
    (tmp_path / "scripts" / "versions.env").write_text(
        'STACKS="base new-1.x"\nPYTHON_VERSION=3.11  # a comment\nTENSORFLOW_CPU_VERSION=2.15.1\nTF_KERAS_VERSION=""\n'
        'KERAS_VERSION=""\nHOROVOD_VERSION=0.28.1\nOPENMPI_VERSION=5.0.11\nNUMPY_SPEC="numpy<2"\nHOROVOD_NO_XLA=0\n'
        "LEGACY_KERAS=0\nSTACK_new_1_x_PYTHON_VERSION=3.13\nSTACK_new_1_x_KERAS_VERSION=3.15.1\n"
        "STACK_new_1_x_OPENMPI_VERSION=9.9\n")
    table = generated.versions_markdown(tmp_path)
    assert "| `base` (default) | 3.11 | 2.15.1 | Keras 2 (built in) | 0.28.1 | 5.0.11 | `numpy<2` | no |" in table
    # OPENMPI_VERSION is not in stack.sh's STACK_VARS: one pin for every row, as load_stack reads it.
    assert "| `new-1.x` | 3.13 | 2.15.1 | Keras 3 (3.15.1) | 0.28.1 | 5.0.11 | `numpy<2` | no |" in table


def _table_rows(markdown, heading):
    section = markdown.split(heading, 1)[1].split("\n### ", 1)[0]
    return {cells[0].strip("`"): cells[1:] for cells in
            ([cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()
             if line.startswith("| `"))}


def test_solver_keys_tables_hold_every_key_with_its_default():
    markdown = generated.solver_keys_markdown()
    detectron = _table_rows(markdown, "### `detectron`")
    for key, default in hvd_sched.SOLVER_KEYS.items():
        assert detectron[key][0] == f"`{default!r}`", key
    for key, iteration_key in hvd_sched.EPOCH_KEYS.items():
        assert iteration_key in detectron[key][1], key
    assert set(detectron) == set(hvd_sched.SOLVER_KEYS) | set(hvd_sched.EPOCH_KEYS)
    # Meanings come from Schedule's docstring (its Args section), without the key they start with.
    documented = " ".join(inspect.getdoc(hvd_sched.Schedule).replace("``", "`").split())
    for key in hvd_sched.SOLVER_KEYS:
        meaning = detectron[key][1]
        assert " ".join(meaning.split()) in documented, key
        assert bool(meaning) == (f"    {key.lower()}: " in hvd_sched.Schedule.__doc__), key
    assert "poly" in detectron["POWER"][1] and not detectron["BASE_LR"][1].startswith("BASE_LR")
    for dialect in dialects.DIALECTS[1:]:
        rows = _table_rows(markdown, f"### `{dialect}`")
        expected = dict(generated._flatten(dialects.DEFAULTS[dialect]))
        assert {key: cells[0] for key, cells in rows.items()} == {key: f"`{val!r}`" for key, val in expected.items()}
        for key, why in dialects.NO_EFFECT[dialect].items():
            assert rows[key][1] == f"no effect: {why}"
    assert "WARMUP.WARMUP_END_ITER" in _table_rows(markdown, "### `video_nonlocal`")


def test_cli_help_is_what_the_program_prints():
    markdown = generated.cli_help_markdown(sys.executable, ROOT)
    assert markdown.count("```text") == len(generated.CLI_COMMANDS) and markdown.count("```") == 2 * len(
        generated.CLI_COMMANDS)
    assert "usage: hvd-sched [-h] {show,plot,check}" in markdown
    for command in ("show", "plot", "check"):
        assert f"### `hvd-sched {command} --help`" in markdown and f"usage: hvd-sched {command} " in markdown
    assert "--dialect {detectron,large_scale_vrd,video_nonlocal}" in markdown


def test_supervise_help_is_what_the_program_prints():
    markdown = generated.supervise_help_markdown(sys.executable, ROOT)
    assert markdown.count("```") == 2 and "usage: python -m hvd_sched.supervise [-h] --checkpoint-dir" in markdown
    for option in ("--grace", "--kill-after", "--orphan-wait"):
        assert option in markdown


def test_markers_are_replaced_and_unknown_ones_raise():
    page = "# Title\n\nbefore\n<!-- generated: one -->\nafter\n```text\n<!-- generated: nothing -->\n```\n"
    out = generated.expand(page, {"one": lambda: "ONE\n"})
    assert out == "# Title\n\nbefore\nONE\nafter\n```text\n<!-- generated: nothing -->\n```\n"
    assert generated.markers(page) == ["one"]
    with pytest.raises(generated.UnknownMarker, match=r"unknown marker <!-- generated: typo -->; known: one"):
        generated.expand("<!-- generated: typo -->\n", {"one": lambda: ""})
    assert generated.expand("text <!-- generated: one --> inline\n", {}) == "text <!-- generated: one --> inline\n"


def test_every_marker_in_the_docs_is_known():
    known = set(generated.generators("index.md"))
    assert known == {"versions", "cli-help", "supervise-help", "solver-keys", "bench-figures"}
    used = {name for page in (ROOT / "docs").rglob("*.md") for name in generated.markers(page.read_text())}
    assert used <= known, used - known
    assert {"cli-help", "supervise-help"} <= set(generated.markers((ROOT / "docs" / "reference" / "cli.md").read_text()))
    assert "bench-figures" in generated.markers((ROOT / "docs" / "results" / "benchmarks.md").read_text())


def test_bench_figures_come_from_the_newest_file_of_each_kind_and_row():
    figures = generated.load_sibling("figures")
    found = figures.newest_files(BENCH)
    assert set(found) == set(figures.KINDS)
    names = sorted(path.name for path in BENCH.glob("*.json"))
    for kind, rows in found.items():
        for row, path, _ in rows:
            suffix = f"_{kind}.json" if row is None else f"_{kind}_{row}.json"
            same = [name for name in names if name.endswith(suffix)]
            assert path.name == same[-1], (kind, row)
    assert [row for row, _, _ in found["apply_loop"]] == ["tf2.15", "tf2.20", "keras3"]
    # Files that name no row (older runs) give way to those that do.
    assert all(row for row, _, _ in found["overhead"])


def test_bench_figures_markdown_names_each_file_command_and_number():
    figures = generated.load_sibling("figures")
    drawn = figures.build(BENCH)
    markdown = generated.bench_figures_markdown(drawn, "results/benchmarks.md", ROOT)
    for figure in drawn:
        assert f"![" in markdown and f"](figures/{figure.kind}.svg)" in markdown
        for path, data in figure.sources:
            assert f"[`docs/bench/{path.name}`](../bench/{path.name})" in markdown
            assert f"`{data['command']}`" in markdown and data["machine"]["date"] in markdown
    newest = json.loads(max(BENCH.glob("*_conv_net_tf2.15.json")).read_text())
    stats = newest["ranks1"]["hvd_sched_optimizer"]
    low, high = stats["ratio_median_ci95"]
    assert f"{stats['ratio_median']:.3f} [{low:.3f}, {high:.3f}]" in markdown
    # Relative to the page: the same figure from a page one folder deeper.
    assert "](../../results/figures/scale.svg)" in generated.bench_figures_markdown(drawn, "how-to/x/page.md", ROOT)


def test_bench_figures_draw_as_svg():
    pytest.importorskip("matplotlib", reason="the figures are drawn with matplotlib, not installed here")
    drawn = generated.bench_figures(ROOT)
    assert [figure.kind for figure in drawn] == list(generated.load_sibling("figures").KINDS)
    for figure in drawn:
        assert figure.svg.lstrip().startswith(b"<?xml") and b"<svg" in figure.svg, figure.kind
        assert figure.src_uri == f"results/figures/{figure.kind}.svg"
    # Drawn twice, the same bytes: no date, fixed ids.
    assert generated.bench_figures(ROOT)[0].svg == drawn[0].svg


def test_the_lr_pictures_are_drawn_from_their_configs():
    """The pages' LR pictures are `hvd-sched plot` of examples/configs, drawn at build time (no PNG in the tree)."""
    pytest.importorskip("matplotlib")
    referenced = set(re.findall(r"\]\((?:\.\./)*(figures/lr_[\w.]+\.png)\)",
                                "".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))))
    assert referenced == {src for src, *_ in generated.LR_PLOTS}, referenced
    for src, config, schedule_args, plot_args in generated.LR_PLOTS:
        assert not (ROOT / "docs" / src).exists(), f"docs/{src} is drawn at build time; remove the copy"
        assert generated.lr_plot_png(config, schedule_args, plot_args).startswith(b"\x89PNG"), src
