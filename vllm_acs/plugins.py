"""The plugin manager: the hook specifications, built-in default plugins, operators' plugins.

API server process. Operators' plugins are found through the `vllm_acs` entry-point group.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping

import pluggy

from . import hookspecs
from .auth.principal import Principal

logger = logging.getLogger(__name__)
ENTRY_POINT_GROUP = "vllm_acs"


def build_plugin_manager(*builtin: object, load_entry_points: bool = True) -> pluggy.PluginManager:
    """A manager with `builtin` plugins (e.g. the key check) and, unless told not to, operators'."""
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    for plugin in builtin:
        manager.register(plugin)
    if load_entry_points:
        loaded = manager.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        if loaded:
            logger.info("loaded %d operator plugin(s) from %r", loaded, ENTRY_POINT_GROUP)
    return manager


async def authenticate(
    manager: pluggy.PluginManager, headers: Mapping[str, str], method: str, path: str
) -> Principal | None:
    """Calls `acs_authenticate` implementations in pluggy's order until one returns a principal.

    pluggy itself cannot await, so the first-result loop is done here: implementations may be
    `async def`, and an async one that answers None still lets the next one decide.
    """
    arguments = {"headers": headers, "method": method, "path": path}
    for impl in reversed(manager.hook.acs_authenticate.get_hookimpls()):
        # Like pluggy, pass only the arguments an implementation names.
        result = impl.function(**{name: arguments[name] for name in impl.argnames})
        if inspect.isawaitable(result):
            result = await result
        if result is not None:
            return result
    return None


def notify_usage_recorded(manager: pluggy.PluginManager, row: object) -> None:
    """Calls every `acs_usage_recorded` implementation; one that fails does not stop the others."""
    for impl in reversed(manager.hook.acs_usage_recorded.get_hookimpls()):
        try:
            impl.function(row=row)
        except Exception:
            logger.exception("acs_usage_recorded of plugin %s failed", impl.plugin_name)
