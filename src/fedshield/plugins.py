"""Loading components: fedshield's own registries, installed plugins and a config's modules.

A user adds an aggregator, attack, client or server algorithm, dataset, model or evaluator
without editing the package, by registering it in a module of their own::

    # my_rules.py
    from pydantic import Field
    from fedshield.aggregators.base import AGGREGATORS, Aggregator
    from fedshield.core.params import Params

    class ShrunkMeanParams(Params):
        factor: float = Field(0.5, gt=0.0, le=1.0, description="shrinkage of the mean")

    @AGGREGATORS.register("shrunk_mean", tags=["uses_weights", "reference_free"])
    class ShrunkMean(Aggregator):
        '''The weighted mean, scaled by a constant factor.'''
        params_schema = ShrunkMeanParams
        def __init__(self, factor: float = 0.5) -> None:
            self.factor = factor
        def aggregate(self, updates, weights=None, *, reference=None):
            ...

and naming it in the config — ``plugins = ["my_rules"]`` (an importable module) or
``plugins = ["my_rules.py"]`` (a file, relative to the config file) — or, for an installed
package, in the ``fedshield.plugins`` entry-point group::

    [project.entry-points."fedshield.plugins"]
    my_rules = "my_package.my_rules"

Plugins are imported before the config is checked, so their names, parameters and tags are
validated like the built-in ones, on the CLI and on both backends (the resolved config
carries the list to every Flower node, which must have the module installed).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import logging
import sys
from collections.abc import Iterable
from pathlib import Path

from fedshield.errors import ConfigError

log = logging.getLogger("fedshield")

ENTRY_POINT_GROUP = "fedshield.plugins"
_loaded: set[str] = set()

#: The packages whose modules register fedshield's own components.
_BUILTIN = (
    "fedshield.aggregators",
    "fedshield.attacks",
    "fedshield.data",
    "fedshield.models",
    "fedshield.algorithms.client",
    "fedshield.algorithms.server",
    "fedshield.eval",
    "fedshield.routing",
    "fedshield.adversarial.registry",
)


def _import_file(path: Path) -> None:
    # One module per file *path*: two configs whose plugins are different files of the same
    # name (my_rules.py next to each) must both load in one process (sweeps, tests).
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    name = f"fedshield_plugin_{path.stem}_{digest}"
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"plugins: cannot import {str(path)!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def load_plugins(modules: Iterable[str] = ()) -> None:
    """Import the built-in registries, every ``fedshield.plugins`` entry point (once), then
    ``modules`` (module names, or ``.py`` paths already resolved against the config file)."""
    for pkg in _BUILTIN:
        importlib.import_module(pkg)
    if "entry-points" not in _loaded:
        _loaded.add("entry-points")
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                ep.load()
            except Exception as err:  # a broken third-party plugin must not hide the others
                log.warning("plugin entry point %s failed to load: %s", ep.name, err)
    for name in modules:
        try:
            if name.endswith(".py"):
                path = Path(name).expanduser()
                if not path.is_file():
                    raise ConfigError(f"plugins: no such file {name!r}")
                _import_file(path.resolve())
            else:
                importlib.import_module(name)
        except ModuleNotFoundError as err:
            raise ConfigError(f"plugins: cannot import {name!r} ({err})") from None
        except ConfigError as err:
            if str(err).startswith("plugins: "):
                raise
            raise ConfigError(f"plugins: {name!r} failed to load: {_one_line(err)}") from None
        except SyntaxError as err:  # also IndentationError, TabError
            same = err.filename is not None and Path(err.filename) == Path(name)
            where = "" if same or not err.filename else f" in {err.filename}"
            where += f" at line {err.lineno}" if err.lineno else ""
            raise ConfigError(f"plugins: {name!r}: syntax error{where}: {err.msg}") from None
        except Exception as err:
            hint = ""
            if "registered twice" in str(err):  # Registry.register: the name is taken
                hint = " (the name is taken, by fedshield or another plugin: choose another)"
            raise ConfigError(
                f"plugins: {name!r} failed to load: {type(err).__name__}: {_one_line(err)}{hint}"
            ) from None


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or "(no message)"


def resolve_plugin_paths(plugins: list[str], config_dir: Path) -> list[str]:
    """Plugin files given relative to the config file, as absolute paths (so the resolved
    config written next to a run, and sent to Flower nodes, still finds them)."""
    out = []
    for name in plugins:
        if name.endswith(".py") and not Path(name).expanduser().is_absolute():
            out.append(str((config_dir / name).resolve()))
        else:
            out.append(name)
    return out


__all__ = ["ENTRY_POINT_GROUP", "load_plugins", "resolve_plugin_paths"]
