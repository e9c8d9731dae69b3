"""The reference pages are rendered from the docstrings: every public name has one, in Google style, and the
examples of the pure package (`import hvd_sched`, no TensorFlow) run as doctests with exactly the output shown.

Public names are `__all__` of `hvd_sched` and of `hvd_sched.keras`. A constant's docstring is the string literal
right after its assignment (where griffe, which renders the pages, reads it), found here with `ast`; the
`make docs` hook (scripts/docs_hooks/checks.py) checks the same statically, and that each name is rendered.
"""

import ast
import doctest
import importlib
import inspect
import pathlib
import pkgutil
import re

import pytest

import hvd_sched
import rows

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE_DIR = ROOT / "hvd_sched"
_REST_LITERAL = re.compile(r"(?<!`)``[^`]+``(?!`)")  # reST's inline literal (not a ``` fence); Markdown's is `x`
_REST_EXAMPLE = re.compile(r"^\s*Examples?::\s*$", re.MULTILINE)
_SINGULAR_EXAMPLE = re.compile(r"^\s*Example:\s*$", re.MULTILINE)
_ARGS = re.compile(r"^\s*Args:\s*$", re.MULTILINE)


def _assigned_docstrings(name):
    """The docstrings of the module-level assignments to `name` anywhere in the package (`ast`, no import)."""
    found = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        body = ast.parse(path.read_text(encoding="utf-8")).body
        for statement, following in zip(body, body[1:]):
            targets = (statement.targets if isinstance(statement, ast.Assign)
                       else [statement.target] if isinstance(statement, ast.AnnAssign) else [])
            if any(isinstance(target, ast.Name) and target.id == name for target in targets):
                is_string = (isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                             and isinstance(following.value.value, str))
                found.append((path.relative_to(ROOT).as_posix(), following.value.value if is_string else None))
    return found


def _style_problems(where, docstring):
    problems = []
    if _REST_EXAMPLE.search(docstring):
        problems.append(f"{where}: reST `Example::` block (write `Examples:` with `>>>` lines or a fenced block)")
    if _SINGULAR_EXAMPLE.search(docstring):
        problems.append(f"{where}: `Example:` section (Google style's is `Examples:`)")
    for literal in _REST_LITERAL.findall(docstring):
        problems.append(f"{where}: reST literal {literal} (Markdown: single backticks)")
    return problems


def _parameters(obj):
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    return [name for name in signature.parameters if name not in ("self", "cls")]


def _problems(module_name):
    module = importlib.import_module(module_name)
    problems = []
    for name in module.__all__:
        obj = getattr(module, name)
        where = f"{module_name}.{name}"
        if not (inspect.isclass(obj) or inspect.isroutine(obj)) or hasattr(obj, "_fields"):
            # a constant or a named tuple: its docstring follows its assignment
            assigned = _assigned_docstrings(name)
            if not assigned:
                problems.append(f"{where}: no module-level assignment found")
            for path, docstring in assigned:
                if not docstring or not docstring.strip():
                    problems.append(f"{where}: no string literal after its assignment in {path}")
                else:
                    problems += _style_problems(f"{where} ({path})", docstring)
            continue
        docstring = inspect.getdoc(obj)
        if not docstring:
            problems.append(f"{where}: no docstring")
            continue
        problems += _style_problems(where, docstring)
        exempt = inspect.isclass(obj) and issubclass(obj, BaseException)  # raised, not built: Attributes
        if not exempt and _parameters(obj) and not _ARGS.search(docstring):
            problems.append(f"{where}: parameters {_parameters(obj)} but no `Args:` section")
        if inspect.isclass(obj):
            for member_name, member in vars(obj).items():
                if member_name.startswith("_"):
                    continue
                function = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
                function = function.fget if isinstance(function, property) else function
                member_doc = inspect.getdoc(function) if callable(function) else None
                if not member_doc or getattr(function, "__doc__", None) is None:
                    continue
                problems += _style_problems(f"{where}.{member_name}", member_doc)
                if (inspect.isfunction(function) and _parameters(function) and not _ARGS.search(member_doc)
                        and not isinstance(member, property)):
                    problems.append(f"{where}.{member_name}: parameters {_parameters(function)} but no `Args:`")
    return problems


@pytest.mark.depends_on(*rows.PURE)
def test_pure_public_names_have_google_style_docstrings():
    assert _problems("hvd_sched") == []


def test_keras_public_names_have_google_style_docstrings():
    assert _problems("hvd_sched.keras") == []


def _pure_modules():
    """Every module of `hvd_sched` outside `hvd_sched.keras`; `_compat` (the Keras stack check, which imports
    TensorFlow and Horovod) is not keras-independent."""
    names = ["hvd_sched"] + [f"hvd_sched.{info.name}" for info in pkgutil.iter_modules(hvd_sched.__path__)
                             if info.name != "keras"]
    return [pytest.param(name, id=name,
                         marks=[] if name == "hvd_sched._compat" else [pytest.mark.depends_on(*rows.PURE)])
            for name in names]


@pytest.mark.parametrize("module_name", _pure_modules())
def test_doctests(module_name, monkeypatch):
    """The examples of the docstrings, run from the repository root (their config paths are relative to it);
    those that write files write them into a temporary folder."""
    monkeypatch.chdir(ROOT)
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(verbose=False)
    report = []
    for test in finder.find(module, module_name, globs=vars(module).copy()):
        runner.run(test, out=report.append)
    results = runner.summarize(verbose=False)
    assert results.failed == 0, "".join(report)
