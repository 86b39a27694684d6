"""Keras 2 under both of its names in a training worker.

Keras 3 (``import keras``, and ``tf.keras`` in TensorFlow 2.16+) crashes in
``model.fit`` under ``MultiWorkerMirroredStrategy`` (keras-team/keras#20585:
``ValueError: Attempt to convert a value (PerReplica:...) to a Tensor``),
with or without Ray. Legacy Keras 2 (the ``tf-keras`` package) trains under
the strategy. ``TF_USE_LEGACY_KERAS=1`` gives it to ``tf.keras`` only;
:func:`use_keras2_everywhere` gives it to ``import keras`` as well, by
resolving ``keras`` and every ``keras.*`` module to ``tf_keras`` and its
modules in this process.

What it costs: code gets the Keras 2 API under the name ``keras``. The
common surface (``Sequential``, ``Model``, layers, optimizers, losses,
``compile``/``fit``/``evaluate``, ``.keras`` and ``.h5`` saving) is the same;
Keras 3-only parts (``keras.ops``, other backends) are not there.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

__all__ = ["use_keras2_everywhere"]

_NAME, _REAL = "keras", "tf_keras"


class _KerasAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``keras.x`` as the already-imported-or-importable ``tf_keras.x``."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _NAME and not fullname.startswith(_NAME + "."):
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(_REAL + spec.name[len(_NAME):])

    def exec_module(self, module: types.ModuleType) -> None:
        """The module is tf_keras's, already executed."""


def use_keras2_everywhere() -> bool:
    """Make ``import keras`` (and ``tf.keras``) give Keras 2 in this process.
    Returns False, changing nothing, where ``tf_keras`` is not installed."""
    if importlib.util.find_spec(_REAL) is None:
        return False
    if any(isinstance(f, _KerasAlias) for f in sys.meta_path):
        return True
    for name in [n for n in sys.modules if n == _NAME or n.startswith(_NAME + ".")]:
        del sys.modules[name]  # a Keras 3 loaded before: later imports get Keras 2
    sys.meta_path.insert(0, _KerasAlias())
    return True
