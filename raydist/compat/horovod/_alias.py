"""``import horovod.torch as hvd`` resolved to :mod:`raydist.compat.horovod.torch`.

Opt-in, per process: :func:`use_horovod_alias` puts a finder first on
``sys.meta_path`` that answers every ``horovod`` and ``horovod.*`` import
with the module of the same name under ``raydist.compat.horovod``, so
Horovod programs run with their imports unchanged. A ``horovod.*`` module
raydist does not provide fails to import with a message saying which it
does. The runners turn it on in their workers; a user can call it too.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

__all__ = ["use_horovod_alias"]

_NAME, _REAL = "horovod", "raydist.compat.horovod"


class _HorovodAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _NAME and not fullname.startswith(_NAME + "."):
            return None
        real = _REAL + fullname[len(_NAME):]
        if importlib.util.find_spec(real) is None:
            raise ModuleNotFoundError(
                f"{fullname} is not provided by raydist.compat.horovod, which maps horovod.torch, "
                f"horovod.tensorflow.keras, horovod.keras, horovod.spark.run, horovod.spark.torch, "
                f"horovod.spark.keras, horovod.spark.lightning and horovod.spark.common (Horovod itself is not "
                f"installed)", name=fullname)
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(_REAL + spec.name[len(_NAME):])

    def exec_module(self, module: types.ModuleType) -> None:
        """The module is raydist's, already executed."""


def use_horovod_alias() -> None:
    """Make ``import horovod...`` give raydist's Horovod API in this process."""
    if any(isinstance(f, _HorovodAlias) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _HorovodAlias())
