"""MkDocs hook: fail the build on a public name without a docstring, or one the reference pages do not render.

The public names are `__all__` of `hvd_sched` and of `hvd_sched.keras`, read statically by griffe (the docs venv
has no TensorFlow, and nothing here imports hvd_sched). Each must have a docstring (for a constant: the string
literal right after its assignment, which is where griffe reads it) and be rendered exactly once by a
`::: hvd_sched...` block of the reference pages, under its public path or the path of the object it re-exports.
"""

import pathlib
import re

import griffe
from mkdocs.exceptions import PluginError

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = ("reference/schedules.md", "reference/keras.md")
MODULES = ("hvd_sched", "hvd_sched.keras")
# `hvd_sched.keras._backend` re-exports its names with `from ._keras2 import *` or `from ._keras3 import *`,
# chosen at import time; griffe cannot follow that, so these names are documented where they are assigned.
PER_VERSION = {"hvd_sched.keras.KERAS_MAJOR": ("hvd_sched.keras._keras2.KERAS_MAJOR",
                                               "hvd_sched.keras._keras3.KERAS_MAJOR")}
_BLOCK = re.compile(r"^:::\s+(hvd_sched[\w.]*)\s*$", re.MULTILINE)


def _public_names(package):
    """{public path: (paths a block may name, paths whose docstrings must exist)} of both modules' `__all__`."""
    names = {}
    for module_path in MODULES:
        module = package if module_path == "hvd_sched" else package[module_path.split(".", 1)[1]]
        if module.exports is None:
            raise PluginError(f"docs: {module_path} has no static __all__ for griffe to read")
        for export in module.exports:
            name = export if isinstance(export, str) else export.name
            public = f"{module_path}.{name}"
            if public in PER_VERSION:
                names[public] = ({public, *PER_VERSION[public]}, PER_VERSION[public])
                continue
            member = module[name]
            try:
                target = member.final_target.path if member.is_alias else member.path
            except griffe.AliasResolutionError as error:
                raise PluginError(f"docs: griffe cannot resolve {public}: {error}") from error
            names[public] = ({public, target}, (public,))
    return names


def _has_docstring(package, path):
    obj = package[path.split(".", 1)[1]]
    docstring = obj.docstring
    return docstring is not None and docstring.value.strip() != ""


def on_files(files, config):
    docs_dir = pathlib.Path(config["docs_dir"])
    package = griffe.load("hvd_sched", search_paths=[str(ROOT)], resolve_aliases=True,
                          resolve_external=False)
    names = _public_names(package)
    missing = sorted(path for public, (_, documented) in names.items() for path in documented
                     if not _has_docstring(package, path))
    if missing:
        raise PluginError("docs: public names without a docstring (a constant's docstring is the string right "
                          "after its assignment): " + ", ".join(missing))
    blocks = []
    for page in PAGES:
        blocks += _BLOCK.findall((docs_dir / page).read_text(encoding="utf-8"))
    problems = []
    for public, (accepted, _) in sorted(names.items()):
        count = sum(block in accepted for block in blocks)
        if count != 1:
            problems.append(f"{public} is rendered {count} times (want one `::: {public}` block)")
    known = set().union(*(accepted for accepted, _ in names.values()))
    problems += [f"`::: {block}` renders no public name" for block in blocks if block not in known]
    if problems:
        raise PluginError(f"docs: the reference pages {', '.join(PAGES)} do not match the public API: "
                          + "; ".join(problems))
    return files
