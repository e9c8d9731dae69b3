"""The package's floor plan, read from its source with ``ast`` (nothing is imported, so no TensorFlow is needed).

Every module under ``hvd_sched/`` (``hvd_sched/keras/`` included) is checked on its own, so a failure names it:

- no import circle (module-level and function-local imports alike);
- no import of another module's private name (``from .x import _name``, or ``x._name`` where an import bound
  ``x`` to a package module); importing a private *module* (``from . import _validation``) is fine, and names
  taken from a module must be public names of it (its ``__all__`` where it has a literal one);
- imports point down the layer table ``LAYERS`` only (docs/explanation/architecture.md describes the floors).
"""

import ast
import pathlib

import pytest

PACKAGE_DIR = pathlib.Path(__file__).resolve().parents[2] / "hvd_sched"

# The floors, bottom first (docs/explanation/architecture.md). A module may import modules of its own floor or below,
# never above: _validation -> policies, momentum -> segments -> schedules -> dialects (data) -> config -> the package's
# front door (hvd_sched/__init__.py re-exports config and below) -> the Keras glue -> plot and the command line.
# A name ending in ".*" covers a subpackage and everything under it.
LAYERS = (
    ("hvd_sched._validation",),
    ("hvd_sched.policies", "hvd_sched.momentum", "hvd_sched.launchers"),
    ("hvd_sched.segments",),
    ("hvd_sched.schedules",),
    ("hvd_sched.dialects",),
    ("hvd_sched.config",),
    ("hvd_sched",),
    ("hvd_sched.keras.*",),
    ("hvd_sched.plot", "hvd_sched.cli", "hvd_sched.supervise"),
)
# Utilities outside the floors: anyone may import them, and they import nothing of hvd_sched.
STANDALONE = ("hvd_sched._version", "hvd_sched._compat")


# ---------------------------------------------------------------------------------------------- reading the source

def module_files(package_dir):
    """``{dotted module name: path}`` of every ``.py`` file under ``package_dir`` (the package named after it)."""
    root = package_dir.parent
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


class Import:
    """One imported thing: ``target`` (a module of the package), ``name`` (a name taken from it, or None when the
    module itself is bound), and the line."""

    def __init__(self, target, name, line):
        self.target, self.name, self.line = target, name, line

    def __repr__(self):
        return f"line {self.line}: {self.target}" + (f" import {self.name}" if self.name else "")


def _base(module, is_package, node):
    """The absolute module a ``from`` statement reads from (relative levels resolved against ``module``)."""
    if not node.level:
        return node.module
    package = module.split(".") if is_package else module.split(".")[:-1]
    package = package[:len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def imports_of(module, path, modules):
    """The package modules ``module`` imports (anywhere in the file), and the private attributes it reads from
    them: ``(imports, private_reads)``, ``private_reads`` as ``(line, 'alias._name')``."""
    top = module.split(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found = []
    bound = {}  # local name -> package module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != top:
                    continue
                found.append(Import(alias.name, None, node.lineno))
                bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, is_package, node)
            if base is None or base.split(".")[0] != top:
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in modules:
                    found.append(Import(submodule, None, node.lineno))
                    bound[alias.asname or alias.name] = submodule
                else:
                    found.append(Import(base, alias.name, node.lineno))
    private_reads = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and _is_private(node.attr) and f"{bound[node.value.id]}.{node.attr}" not in modules):
            private_reads.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return found, private_reads


def _is_dunder(name):
    return name.startswith("__") and name.endswith("__")


def _is_private(name):
    return name.startswith("_") and not _is_dunder(name)


def public_names(path):
    """A module's ``__all__`` when it is a literal list or tuple, else None (none, or computed: unknown here)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                return set(ast.literal_eval(node.value))
            except ValueError:
                return None
    return None


def private_name_problems(module, modules):
    """Each private name ``module`` takes from another module, and each name missing from that module's
    ``__all__``, as one line of text."""
    found, private_reads = imports_of(module, modules[module], modules)
    problems = []
    for item in found:
        if item.name is None or item.target == module:
            continue
        if _is_private(item.name):
            problems.append(f"{item!r} (a private name of {item.target})")
        elif item.name != "*" and not _is_dunder(item.name) and item.target in modules:
            # A star import takes __all__ itself; a dunder (__version__, __all__) is the module's own.
            exported = public_names(modules[item.target])
            if exported is not None and item.name not in exported:
                problems.append(f"{item!r} (not in {item.target}.__all__)")
    problems += [f"line {line}: reads {read} (a private name of another module)" for line, read in private_reads]
    return problems


def import_graph(modules):
    """``{module: {imported module: [Import, ...]}}`` (self-imports left out)."""
    graph = {}
    for module, path in modules.items():
        edges = {}
        for found in imports_of(module, path, modules)[0]:
            if found.target != module:
                edges.setdefault(found.target, []).append(found)
        graph[module] = edges
    return graph


def cycle_through(graph, start):
    """The shortest import path ``start -> ... -> start``, or None (breadth-first over the graph)."""
    parents = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for target in sorted(graph.get(module, {})):
                if target == start:
                    path = [module]
                    while parents[path[-1]] is not None:
                        path.append(parents[path[-1]])
                    return path[::-1] + [start]
                if target not in parents:
                    parents[target] = module
                    following.append(target)
        frontier = following
    return None


def floor_of(module):
    """The index of ``module``'s floor in ``LAYERS``, or None when the table has no floor for it."""
    for index, floor in enumerate(LAYERS):
        for name in floor:
            if module == name or name.endswith(".*") and (module + ".").startswith(name[:-1]):
                return index
    return None


MODULES = module_files(PACKAGE_DIR)
GRAPH = import_graph(MODULES)


# ---------------------------------------------------------------------------------------------- the checks

@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_circle(module):
    cycle = cycle_through(GRAPH, module)
    assert cycle is None, f"{module} imports itself through {' -> '.join(cycle)}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_names_across_modules(module):
    problems = private_name_problems(module, MODULES)
    assert not problems, f"{module} reaches into other modules' private names:\n" + "\n".join(problems)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_layers(module):
    edges = GRAPH[module]
    if module in STANDALONE:
        assert not edges, f"{module} is a standalone utility but imports {sorted(edges)}"
        return
    floor = floor_of(module)
    assert floor is not None, f"{module} has no floor in LAYERS (tests/unit/test_architecture.py): add it"
    upward = [f"{found!r} (floor {floor_of(target)} > {floor})"
              for target, imports in sorted(edges.items()) if target not in STANDALONE
              for found in imports if floor_of(target) is None or floor_of(target) > floor]
    assert not upward, f"{module} (floor {floor}: {LAYERS[floor]}) imports upward:\n" + "\n".join(upward)


# ---------------------------------------------------------------------------------------------- the checker itself

def test_the_scanner_sees_the_package_imports():
    """Known edges, so that a scanner that finds nothing cannot pass the checks above vacuously."""
    assert "hvd_sched._validation" in GRAPH["hvd_sched.schedules"]
    assert "hvd_sched.dialects" in GRAPH["hvd_sched.config"]
    assert "hvd_sched.plot" in GRAPH["hvd_sched.cli"]  # a function-local import
    assert "hvd_sched._compat" in GRAPH["hvd_sched.keras"]  # an absolute import from the subpackage
    assert "hvd_sched" in GRAPH["hvd_sched.keras.build"]  # from .. import Schedule
    assert all(floor_of(module) is not None for module in MODULES if module not in STANDALONE)


def _fake_package(tmp_path, files):
    package = tmp_path / "pkg"
    for name, source in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return module_files(package)


def test_the_checker_finds_a_function_local_circle_and_private_names(tmp_path):
    modules = _fake_package(tmp_path, {
        "__init__.py": "",
        "low.py": "__all__ = ['public']\n_secret = 1\npublic = 2\n"
                  "def late():\n    from .sub.high import thing\n    return thing\n",
        "sub/__init__.py": "",
        "sub/high.py": "from ..low import _secret, public\nfrom .. import low as base\nthing = base._secret\n"
                       "import pkg.low\n",
        "star.py": "from .low import *\nfrom .low import __all__\n",
        "computed.py": "from .star import __all__ as _names\n__all__ = [*_names, 'more']\nmore = 1\n",
        "user.py": "from .computed import more\n",
    })
    graph = import_graph(modules)
    assert set(graph["pkg.low"]) == {"pkg.sub.high"}
    assert set(graph["pkg.sub.high"]) == {"pkg.low"}
    assert cycle_through(graph, "pkg.low") == ["pkg.low", "pkg.sub.high", "pkg.low"]
    found, private_reads = imports_of("pkg.sub.high", modules["pkg.sub.high"], modules)
    assert [(item.target, item.name) for item in found if item.name] == [("pkg.low", "_secret"), ("pkg.low", "public")]
    assert private_reads == [(3, "base._secret")]
    assert cycle_through(import_graph({"pkg.low": modules["pkg.low"]}), "pkg.low") is None
    assert set(graph["pkg.star"]) == {"pkg.low"} and private_name_problems("pkg.star", modules) == []
    assert private_name_problems("pkg.user", modules) == []  # a computed __all__ is not read
    assert private_name_problems("pkg.sub.high", modules) == [
        "line 1: pkg.low import _secret (a private name of pkg.low)",
        "line 3: reads base._secret (a private name of another module)"]


def test_floor_table():
    assert floor_of("hvd_sched._validation") == 0
    assert floor_of("hvd_sched.keras._slots") == floor_of("hvd_sched.keras") > floor_of("hvd_sched.config")
    assert floor_of("hvd_sched.cli") == floor_of("hvd_sched.plot") == len(LAYERS) - 1
    assert floor_of("hvd_sched.unknown") is None and floor_of("hvd_sched.kerasx") is None
