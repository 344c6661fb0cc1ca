"""Attention heatmaps and widgets.

``core`` holds the static heatmap and the widget base class; each notebook topic adds
its widgets in a sibling module (masks, positions, kv, tiles, explorer...). Every
public name of every module is re-exported here, so ``from selfattn_lite.viz import X``
works for all of them.
"""

import importlib
import pkgutil

from .core import *  # noqa: F403
from .core import __all__ as _core_all

__all__ = list(_core_all)
for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):  # noqa: F405
    if _info.name == "core":
        continue
    _module = importlib.import_module(f"{__name__}.{_info.name}")
    for _name in getattr(_module, "__all__", []):
        globals()[_name] = getattr(_module, _name)
        __all__.append(_name)
