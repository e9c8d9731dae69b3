"""Every example of the README and of the documentation site runs, and every output they quote is what runs.

The rules (which blocks run, how outputs are compared, the skip and prelude comments) are in docblocks.py. Each
block runs in its own interpreter of the row's venv, in a temporary folder with the repository's ``examples/``,
so a block's relative paths work as in the text and nothing is written into the tree.
"""

import doctest
import json
import os
import pathlib
import re
import sys
import unicodedata

import pytest
import yaml

import hvd_sched
from docblocks import PRELUDES, ROOT, RUN_LANGS, blocks, console_steps, docstring_blocks, pages
from launch import run_command
import rows

BIN = pathlib.Path(sys.executable).parent
_PURE = re.compile(r"tensorflow|hvd_sched\.keras|horovod|keras")
_RANK_LINE = re.compile(r"^\[(\d+)\]<stdout>:(.*)$")
# Keras' own progress output (`Epoch 3/8`, the bars), which the pages leave out of the outputs they quote.
_KERAS_PROGRESS = re.compile(r"^\s*(Epoch \d+/\d+|\d+/\d+ .*)?\s*$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DOCTEST_RUNNER = """
import doctest, sys
text = open(sys.argv[1]).read()
globs = {"__name__": "__main__"}
exec(open(sys.argv[2]).read(), globs)
test = doctest.DocTestParser().get_doctest(text, globs, sys.argv[3], sys.argv[3], 0)
runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
runner.run(test)
sys.exit(1 if runner.failures else 0)
"""


def _all_blocks():
    return [b for page in pages() for b in blocks(page) if b.lang in RUN_LANGS]


def _params():
    params = []
    for block in _all_blocks():
        needs_keras = _PURE.search(block.text + PRELUDES.get(block.arg or "", "")) or block.kind == "prelude"
        marks = [] if needs_keras else [pytest.mark.depends_on(*rows.PURE)]
        if block.lang == "console" and "horovodrun" in block.text:
            marks.append(pytest.mark.multirank)  # the serial phase: a 2-rank job takes both cores
        params.append(pytest.param(block, id=block.id, marks=marks))
    return params


@pytest.fixture
def work(tmp_path):
    """A folder where `examples/` is the repository's: the blocks' paths resolve, their outputs stay here."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    return tmp_path


def _run(command, cwd, timeout=300):
    """launch.run_command (the ranks' environment; the whole process group killed on a timeout), the venv's
    programs first on PATH -> (exit status, stdout, stderr)."""
    proc = run_command(command, cwd, {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}, timeout)
    return proc.returncode, proc.stdout, proc.stderr


def _same(want, got):
    """doctest's comparison with ELLIPSIS: `...` matches any text, a line `...` any lines."""
    return doctest.OutputChecker().check_output(want, got, doctest.ELLIPSIS)


def _console_command(command):
    """The venv's programs for the names a block uses; None for a command the test does not run."""
    words = command.split()
    if words[0] in ("python", "hvd-sched"):
        return [sys.executable if words[0] == "python" else str(BIN / "hvd-sched"), *words[1:]]
    if words[0] == "horovodrun":
        return [str(BIN / "horovodrun"), *[sys.executable if w == "python" else w for w in words[1:]]]
    return None


def _ranks_stdout(out):
    """horovodrun's output as each rank's stdout lines, rank 0's first (a rank's own order is kept), without Keras'
    progress lines and blank lines."""
    by_rank = {}
    for line in _ANSI.sub("", out).replace("\r", "\n").splitlines():
        match = _RANK_LINE.match(line)
        if match and not _KERAS_PROGRESS.match(match[2]):
            by_rank.setdefault(int(match[1]), []).append(match[2])
    return "".join(line + "\n" for rank in sorted(by_rank) for line in by_rank[rank])


@pytest.mark.parametrize("block", _params())
def test_block(block, work):
    where = f"{block.id} ({block.lang} block)"
    if block.kind == "skip":
        if block.lang == "python":
            compile(block.text, where, "exec")
        return
    prelude = PRELUDES[block.arg] if block.kind == "prelude" else ""
    if block.lang == "yaml":
        config = yaml.safe_load(block.text)
        if isinstance(config, dict) and "SOLVER" in config:
            # as the pages' configs run: on the demo's 2 ranks where the config scales by the world size
            scaled = "REFERENCE_WORLD_SIZE" in (config["SOLVER"] or {})
            hvd_sched.from_detectron(config, world_size=2 if scaled else None, steps_per_epoch=22)
    elif block.lang == "python":
        script = work / "block.py"
        script.write_text(prelude + "\n" + block.text)
        code, out, err = _run([sys.executable, str(script)], work)
        assert code == 0, f"{where} exited {code}\n{out[-4000:]}\n{err[-6000:]}"
    elif block.lang == "pycon":
        (work / "runner.py").write_text(_DOCTEST_RUNNER)
        (work / "block.txt").write_text(block.text)
        (work / "prelude.py").write_text(prelude)
        code, out, err = _run([sys.executable, "runner.py", "block.txt", "prelude.py", where], work)
        assert code == 0, f"{where}: the doctest failed\n{out[-8000:]}\n{err[-4000:]}"
    else:
        for command, want in console_steps(block.text):
            argv = _console_command(command)
            assert argv, \
                f"{where}: `{command}` is not a command this test runs; mark the block <!-- test: skip ... -->"
            code, out, err = _run(argv, work)
            got = _ranks_stdout(out) if argv[0].endswith("horovodrun") else out
            assert code == 0, f"{where}: `{command}` exited {code}\n{out[-4000:]}\n{err[-4000:]}"
            assert _same(want, got), f"{where}: `{command}` prints\n{got}\nbut the text shows\n{want}"


def test_every_skip_names_a_reason_and_every_prelude_exists():
    for block in (b for page in pages() for b in blocks(page)):
        if block.kind == "skip":
            assert block.lang in RUN_LANGS and len(block.arg.split()) >= 3, \
                f"{block.id}: a skip names why the block cannot run here (and marks a block that would run)"
        if block.kind == "prelude":
            assert block.arg in PRELUDES, \
                f"{block.id}: no prelude {block.arg!r}; docblocks.PRELUDES has {sorted(PRELUDES)}"


def test_the_site_has_examples_to_run():
    """The pages this test reads are the ones there are: the collection above is not silently empty."""
    langs = [b.lang for b in _all_blocks()]
    assert langs.count("python") >= 3 and langs.count("pycon") >= 3 and langs.count("console") >= 2, langs


def _slug(heading):
    """Python-Markdown's toc slug (what MkDocs and the site's anchors use) of a heading's text."""
    text = unicodedata.normalize("NFKD", re.sub(r"[`*]", "", heading)).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


@pytest.mark.depends_on(*rows.LAUNCHER)  # the files only
def test_the_readmes_links_reach_pages_and_anchors():
    """The site's build checks its own links (strict); the README is outside it, so its links are checked here."""
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert len(links) >= 10, links
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), f"README links to {link}, which is not a file"
        if anchor:
            headings = re.findall(r"(?m)^#{1,6} (.+)$", target.read_text())
            assert anchor in {_slug(h) for h in headings}, f"README links to {link}: no such heading in {path}"


_DOCSTRING_RUNNER = """
import json, os, sys, textwrap, traceback
os.makedirs("runs", exist_ok=True)
base = {"__name__": "__main__"}
exec(open(sys.argv[1]).read(), base)
failed = []
for where, code in json.loads(open(sys.argv[2]).read()):
    code = textwrap.dedent(code)
    try:
        exec(compile(code, where, "exec"), dict(base))
    except BaseException:
        failed.append(where + ":\\n" + code + traceback.format_exc(limit=-3))
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_the_reference_pages_examples_run(work):
    """The fenced examples of hvd_sched's docstrings, which the reference pages render, run one after another on
    the prelude's model and data (the pure modules' doctests: test_docstrings.py)."""
    examples = docstring_blocks()
    assert len(examples) >= 10, examples
    (work / "runner.py").write_text(_DOCSTRING_RUNNER)
    (work / "prelude.py").write_text(PRELUDES["docstrings"])
    (work / "examples.json").write_text(json.dumps(examples))
    code, out, err = _run([sys.executable, "runner.py", "prelude.py", "examples.json"], work, timeout=600)
    assert code == 0, f"docstring examples failed:\n{out[-10000:]}\n{err[-3000:]}"


@pytest.mark.depends_on(*rows.LAUNCHER)  # the files only
def test_every_example_imports_hvd_sched_before_horovods_keras_layer():
    """On the tf2.21 row Horovod's Keras layer imported first holds Keras 3, and hvd_sched stops the script: every
    example that imports `horovod.tensorflow.keras` imports hvd_sched.keras (or hvd_sched._compat) before it. The
    examples run after a prelude that has imported it already, so the order is checked here, in the text."""
    examples = [(b.id, b.text) for page in pages() for b in blocks(page) if b.lang in ("python", "pycon")]
    examples += docstring_blocks() + [(f"docblocks.PRELUDES[{name!r}]", code) for name, code in PRELUDES.items()]
    assert len(examples) > 20, examples
    for where, code in examples:
        horovod = re.search(r"import[^\n]*\bhorovod\.tensorflow\.keras\b", code)
        if horovod:
            ours = re.search(r"import[^\n]*\bhvd_sched\.(keras|_compat)\b", code)
            assert ours and ours.start() <= horovod.start() and (
                ours.start() < horovod.start() or code.index("hvd_sched", ours.start()) < horovod.end()), \
                f"{where}: imports horovod.tensorflow.keras before hvd_sched.keras:\n{code}"
