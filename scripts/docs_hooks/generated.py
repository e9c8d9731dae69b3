"""MkDocs hook: fills in what the code and the data files already say, so that no page repeats it by hand.

A line ``<!-- generated: NAME -->`` (alone on its line, outside code blocks) in any page is replaced, at build
time, by the Markdown of NAME:

- ``versions``: the support matrix, each row's pins from ``scripts/versions.env`` as ``scripts/stack.sh`` resolves them.
- ``cli-help``: ``hvd-sched --help`` and each subcommand's ``--help``, as the program prints them.
- ``supervise-help``: ``python -m hvd_sched.supervise --help``.
- ``solver-keys``: every SOLVER key of each dialect with its default (``hvd_sched.dialects``), the meaning from
  ``Schedule``'s docstring, and why a key has no effect (``hvd_sched.dialects.NO_EFFECT``).
- ``bench-figures``: the benchmark figures (SVG, drawn from ``docs/bench/*.json`` by ``figures.py`` in
  ``on_files``) with a table of the same numbers, the data files and the commands that reproduce them.

``on_files`` also draws the LR pictures of ``LR_PLOTS`` from their configs with ``hvd_sched.plot`` (what ``hvd-sched
plot`` writes), so a changed config or plot changes the picture. An unknown NAME fails the build. The generation
is plain functions (no mkdocs import at module level), so that ``tests/docs/test_generated.py`` can test it in the
test environments, which have no mkdocs.
"""

import importlib.util
import inspect
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^[ \t]*<!--[ \t]*generated:[ \t]*(?P<name>\S+?)[ \t]*-->[ \t]*$")
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")
CLI_COMMANDS = ((), ("show",), ("plot",), ("check",))


#: The LR pictures of the pages: (site path, config, from_detectron's arguments, plot_schedule's arguments).
LR_PLOTS = (
    ("figures/lr_digits.png", "examples/configs/digits_warmup_steps.yaml",
     {"world_size": 2, "steps_per_epoch": 22}, {"steps_per_epoch": 22}),
    ("figures/lr_large_batch_constant_warmup.png",
     "examples/configs/e2e_faster_rcnn_R-50-FPN_1x_large_batch_constant_warmup.yaml", {}, {"log_scale": True}),
)


def lr_plot_png(config, schedule_args, plot_args, root=ROOT):
    """The PNG bytes of `hvd-sched plot` for one of LR_PLOTS (matplotlib, Agg)."""
    import tempfile

    import hvd_sched
    from hvd_sched import plot

    schedule = hvd_sched.from_detectron(str(pathlib.Path(root) / config), **schedule_args)
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "lr.png"
        plot.plot_schedule(schedule, str(path), **plot_args)
        return path.read_bytes()


class UnknownMarker(ValueError):
    """A ``<!-- generated: NAME -->`` marker whose NAME no generator has."""


# --- versions ---------------------------------------------------------------------------------------------------

#: The pins the table shows, as `load_stack` of scripts/stack.sh sets them for a row.
_TABLE_PINS = ("PYTHON_VERSION", "TENSORFLOW_CPU_VERSION", "TF_KERAS_VERSION", "KERAS_VERSION", "LEGACY_KERAS",
               "HOROVOD_VERSION", "OPENMPI_VERSION", "NUMPY_SPEC", "HOROVOD_NO_XLA")
_ROW_PINS = '. "$1/scripts/stack.sh" && load_stack "$2" && for v in "${@:3}"; do printf "%s=%s\\n" "$v" "${!v}"; done'


def stack_rows(root=ROOT):
    """``[(row, pins)]`` in STACKS order, each row's pins resolved by scripts/stack.sh itself (its `load_stack`:
    the default row's unprefixed names, another row's ``STACK_<row>_<VAR>`` overrides), not by a second parser."""
    def bash(*args):
        return subprocess.run(["bash", *args], capture_output=True, text=True, check=True).stdout

    rows = []
    for name in bash(str(pathlib.Path(root) / "scripts" / "stack.sh"), "--list").split():
        out = bash("-c", _ROW_PINS, "stack", str(root), name, *_TABLE_PINS)
        rows.append((name, dict(line.split("=", 1) for line in out.splitlines())))
    return rows


def _tf_keras(pins):
    if pins.get("LEGACY_KERAS") == "1":
        return f"tf-keras {pins['TF_KERAS_VERSION']} (`TF_USE_LEGACY_KERAS=1`)"
    if pins.get("KERAS_VERSION"):
        return f"Keras 3 ({pins['KERAS_VERSION']})"
    return "Keras 2 (built in)"


def versions_markdown(root=ROOT):
    """The support-matrix table, one line per row of ``scripts/versions.env``."""
    rows = stack_rows(root)
    lines = ["| row | Python | TensorFlow | `tf.keras` is | Horovod | Open MPI | numpy | Horovod without its XLA ops |",
             "|---|---|---|---|---|---|---|---|"]
    for index, (name, pins) in enumerate(rows):
        label = f"`{name}` (default)" if index == 0 else f"`{name}`"
        lines.append(f"| {label} | {pins['PYTHON_VERSION']} | {pins['TENSORFLOW_CPU_VERSION']} | {_tf_keras(pins)} | "
                     f"{pins['HOROVOD_VERSION']} | {pins['OPENMPI_VERSION']} | `{pins['NUMPY_SPEC']}` | "
                     f"{'yes' if pins.get('HOROVOD_NO_XLA') == '1' else 'no'} |")
    return "\n".join(lines + ["", "From `scripts/versions.env`; `make test STACK=<row>` runs a row (default: the "
                              "first)."])


# --- cli-help ---------------------------------------------------------------------------------------------------

def cli_help_markdown(python=sys.executable, root=ROOT):
    """``hvd-sched [COMMAND] --help`` in ``text`` blocks, run as ``python -m hvd_sched.cli`` at 80 columns."""
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": os.pathsep.join(filter(None, [str(root),
                                                                                      os.environ.get("PYTHONPATH")]))}
    parts = []
    for command in CLI_COMMANDS:
        done = subprocess.run([python, "-m", "hvd_sched.cli", *command, "--help"], cwd=root, env=env,
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"hvd-sched {' '.join(command)} --help exited {done.returncode}: {done.stderr}")
        title = " ".join(["hvd-sched", *command, "--help"])
        parts += [f"### `{title}`", "", "```text", done.stdout.rstrip("\n"), "```", ""]
    return "\n".join(parts)


def supervise_help_markdown(python=sys.executable, root=ROOT):
    """``python -m hvd_sched.supervise --help`` in a ``text`` block, at 80 columns."""
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": os.pathsep.join(filter(None, [str(root),
                                                                                      os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([python, "-m", "hvd_sched.supervise", "--help"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"python -m hvd_sched.supervise --help exited {done.returncode}: {done.stderr}")
    return "\n".join(["```text", done.stdout.rstrip("\n"), "```", ""])


# --- solver-keys ------------------------------------------------------------------------------------------------

def docstring_arguments(function_or_class):
    """``{argument: first sentence}`` of a Google-style docstring's ``Args:`` section (RST ``x`` -> ``x``)."""
    doc = inspect.getdoc(function_or_class) or ""
    section = re.search(r"^Args:\n((?:[ \t]+.*\n?|\n)+)", doc, re.MULTILINE)
    meanings, current = {}, None
    for line in (section.group(1) if section else "").splitlines():
        entry = re.match(r"^    (\w+): (.*)$", line)
        if entry:
            current = entry.group(1)
            meanings[current] = entry.group(2)
        elif current and line.startswith("     "):
            meanings[current] += " " + line.strip()
    first = {}
    for name, text in meanings.items():
        sentence = re.split(r"(?<=\.)\s+(?=[A-Z`])", text.replace("``", "`"), maxsplit=1)[0]
        first[name] = sentence
    return first


def _meaning(key, text):
    """The docstring's sentence without the key it starts with (``BASE_LR, > 0.`` -> ``> 0.``)."""
    return re.sub(rf"^{re.escape(key)}\b[,:]?\s*", "", text)


def _cell(value):
    return f"`{value!r}`".replace("|", "\\|")


def _flatten(defaults, prefix=""):
    for key, value in defaults.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def solver_keys_markdown():
    """One table per dialect: key, default, meaning (or why it has no effect)."""
    from hvd_sched import dialects
    from hvd_sched.schedules import Schedule

    meanings = docstring_arguments(Schedule)
    parts = []
    for dialect in dialects.DIALECTS:
        lines = [f"### `{dialect}` ({dialects.LABELS[dialect]})", "",
                 f"`from_detectron(..., dialect={dialect!r})`.", "", "| key | default | meaning |", "|---|---|---|"]
        if dialect == "detectron":
            for key, default in dialects.SOLVER_KEYS.items():
                lines.append(f"| `{key}` | {_cell(default)} | {_meaning(key, meanings.get(key.lower(), ''))} |")
            for key, iteration_key in dialects.EPOCH_KEYS.items():
                lines.append(f"| `{key}` | (none) | {iteration_key} in epochs, converted with `steps_per_epoch` |")
        else:
            no_effect = dialects.NO_EFFECT.get(dialect, {})
            for key, default in _flatten(dialects.DEFAULTS[dialect]):
                note = f"no effect: {no_effect[key]}" if key in no_effect else ""
                lines.append(f"| `{key}` | {_cell(default)} | {note} |")
        parts += lines + [""]
    return "\n".join(parts)


# --- bench-figures ----------------------------------------------------------------------------------------------

def load_sibling(name):
    """A module of this folder (``figures``), loaded by path under a private name: no sys.path change."""
    module_name = f"_hvd_sched_docs_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, pathlib.Path(__file__).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def bench_figures(root=ROOT):
    """The benchmark figures of ``docs/bench``, drawn (``figure.svg`` holds each SVG)."""
    figures = load_sibling("figures")
    drawn = figures.build(root / "docs" / "bench")
    for figure in drawn:
        figures.render(figure)
    return drawn


def bench_figures_markdown(drawn, page_uri, root=ROOT):
    if not drawn:
        return "No benchmark results in `docs/bench/`."
    return "\n".join(figure.markdown(page_uri, root) for figure in drawn)


# --- markers ----------------------------------------------------------------------------------------------------

def markers(markdown):
    """The marker names of a page, in order (lines inside fenced code blocks are left alone)."""
    return [name for _, name in _scan(markdown.splitlines()) if name]


def _scan(lines):
    fence = None
    for line in lines:
        opening = _FENCE.match(line)
        if opening and (fence is None or opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence)):
            fence = opening.group(1) if fence is None else None
            yield line, None
            continue
        match = MARKER.match(line) if fence is None else None
        yield line, match.group("name") if match else None


def expand(markdown, generators):
    """``markdown`` with each marker replaced by ``generators[name]()``; ``UnknownMarker`` for a name not there."""
    out = []
    for line, name in _scan(markdown.splitlines()):
        if name is None:
            out.append(line)
        elif name not in generators:
            raise UnknownMarker(f"unknown marker <!-- generated: {name} -->; known: {', '.join(sorted(generators))}")
        else:
            out.append(generators[name]().rstrip("\n"))
    return "\n".join(out) + ("\n" if markdown.endswith("\n") else "")


def generators(page_uri, drawn=(), root=ROOT, python=sys.executable):
    """The marker names and what each produces for the page at ``page_uri``."""
    return {
        "versions": lambda: versions_markdown(root),
        "cli-help": lambda: cli_help_markdown(python, root),
        "supervise-help": lambda: supervise_help_markdown(python, root),
        "solver-keys": solver_keys_markdown,
        "bench-figures": lambda: bench_figures_markdown(drawn, page_uri, root),
    }


# --- MkDocs events ----------------------------------------------------------------------------------------------

_DRAWN = []


def on_files(files, config):
    """Draw the benchmark figures and add each SVG to the site as ``results/figures/<kind>.svg``."""
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File

    try:
        _DRAWN[:] = bench_figures()
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise PluginError(f"generated.py: cannot draw the benchmark figures from docs/bench: {error!r}") from error
    for figure in _DRAWN:
        files.append(File.generated(config, figure.src_uri, content=figure.svg))
    for src_uri, config_file, schedule_args, plot_args in LR_PLOTS:
        try:
            png = lr_plot_png(config_file, schedule_args, plot_args)
        except (OSError, ValueError, TypeError) as error:
            raise PluginError(f"generated.py: cannot plot {config_file}: {error!r}") from error
        files.append(File.generated(config, src_uri, content=png))
    return files


def on_page_markdown(markdown, page, config, files):
    from mkdocs.exceptions import PluginError

    if not markers(markdown):
        return markdown
    try:
        return expand(markdown, generators(page.file.src_uri, _DRAWN))
    except (UnknownMarker, RuntimeError, OSError, ValueError, KeyError) as error:
        raise PluginError(f"{page.file.src_uri}: {error}") from error
