"""A researcher's own code: modules named by a run, and installed packages' entry points.

Two ways in, both of which register into the same registries the built-ins use
(``secagg.clients.tasks.TASKS``, ``secagg.protocols.PROTOCOLS``, ``secagg.backends.BACKENDS``),
so every place that lists or looks up a task, protocol or backend (CLI choices, configs,
workers, nodes) sees them:

- **modules a run names** (``--import mymodule``, ``imports = ["mymodule"]`` in a config,
  ``ExperimentConfig(imports=[...])``): imported before the run's settings are checked;
  a module calls ``register_task`` / ``register_protocol`` / ``register_backend`` at
  import. A name is a module importable from the current folder or ``sys.path``, or a
  path to a ``.py`` file. The run records the names in its config.toml, so the rerun
  command imports them again, and worker processes and Flower nodes import them before
  they build a client.
- **installed packages** declare entry points in the groups ``secagg.tasks`` (a
  :class:`~secagg.clients.tasks.Task`, or a callable returning one), ``secagg.protocols``
  (a ``Protocol`` class) and ``secagg.backends`` (a :class:`~secagg.backends.BackendSpec`,
  or a callable returning one); each registry loads its group when a name is not found,
  and the command line loads all three before it lists choices.

Importing a module runs its code: name only modules you trust, as with ``python -m``.
On a Flower node the coordinator's experiment names modules too, and the node runs none
of them: only the modules its operator named in its own ``node.toml`` are imported, and an
experiment naming any other is refused (:func:`only_node_modules`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from secagg.errors import ConfigError

TASK_GROUP = "secagg.tasks"
PROTOCOL_GROUP = "secagg.protocols"
BACKEND_GROUP = "secagg.backends"

_loaded_groups: set[str] = set()

#: while a Flower node reads its experiment: the modules its own node.toml imported (by
#: module name); None elsewhere
_node_modules: frozenset[str] | None = None


def module_key(name: str) -> str:
    """The module a name imports: a .py path's file stem, else the name itself."""
    return Path(name).stem if is_module_path(name) else name


@contextmanager
def only_node_modules(own: Iterable[str]) -> Iterator[None]:
    """On a Flower node: the modules an experiment names are not imported (the coordinator
    does not choose what code a node runs); each must be one of ``own``, the modules the
    node's operator named and imported already (its node.toml), which stands in for it.
    Any other is refused with :class:`ConfigError`."""
    global _node_modules
    previous, _node_modules = _node_modules, frozenset(module_key(n) for n in own)
    try:
        yield
    finally:
        _node_modules = previous


def is_module_path(name: str) -> bool:
    """A name that is a file path (``./mine.py``, ``code/mine.py``) rather than a module."""
    return name.endswith(".py") or os.sep in name or "/" in name


def recorded_name(name: str) -> str:
    """How a run records a module it imported: file paths absolute (a rerun from another
    folder finds them), module names as given."""
    return str(Path(name).resolve()) if is_module_path(name) else name


def import_user_modules(names: Iterable[str]) -> None:
    """Import each named module once (a second call is free). Raises ``ConfigError``
    naming the module and what to do when one cannot be imported; an error raised by the
    module's own code propagates with its traceback."""
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"imports: expected module names or .py paths, got {name!r}")
        if _node_modules is not None:
            if module_key(name) not in _node_modules:
                raise ConfigError(
                    f"the experiment imports {name!r}, which this node's node.toml does not "
                    "name: a node runs only code its operator names; put the path of your "
                    f"copy of {module_key(name)!r} in node.toml (imports = [...]) if you "
                    "trust it"
                )
            continue  # the node's own copy, imported by its node.toml, stands in for it
        if is_module_path(name):
            _import_file(Path(name))
        else:
            _import_module(name)


def _import_module(name: str) -> None:
    if name in sys.modules:
        return
    # like `python -m`: the current folder is where a researcher's module usually lies,
    # and the `secagg` script's own folder is not it
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.startswith(exc.name):
            raise ConfigError(
                f"cannot import {name!r}: no such module from {cwd} or sys.path; run from "
                "the folder that holds it, add that folder to PYTHONPATH, or give the path "
                "of the .py file"
            ) from None
        raise


def _import_file(path: Path) -> None:
    path = path.resolve()
    if not path.is_file():
        raise ConfigError(f"cannot import {str(path)!r}: no such file")
    if path.suffix != ".py":
        raise ConfigError(f"cannot import {str(path)!r}: a module file ends in .py")
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return
        raise ConfigError(
            f"cannot import {str(path)!r}: a module named {name!r} is already imported from "
            f"{getattr(loaded, '__file__', '?')}; rename the file"
        )
    # imported under its own name, with its folder on sys.path, so that what it registers
    # pickles by reference and worker processes import the same module again
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    importlib.import_module(name)


def new_entry_points(group: str) -> list[EntryPoint]:
    """The entry points installed packages declare in ``group``, the first time a process
    asks (later calls return none: each registry loads its group once)."""
    if group in _loaded_groups:
        return []
    _loaded_groups.add(group)
    return list(entry_points(group=group))


def forget_entry_points() -> None:
    """Let the next lookup read the entry points again (tests that install some)."""
    _loaded_groups.clear()
