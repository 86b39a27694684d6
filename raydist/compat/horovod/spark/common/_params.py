"""Horovod's estimator parameters: given by keyword, read and changed by
``getX``/``setX`` (``getFeatureCols``, ``setEpochs``...), saved and loaded.

Horovod declares each as a Spark ML ``Param``; what users touch is the
keyword, the getter, the setter and ``save``/``load``, which this gives for
every name in a class's ``_defaults`` (a name it does not know is refused
naming it). Save writes a directory: ``params.pkl`` (every parameter but the
Store and the Backend, which belong to one run, as in Horovod) and
``class.json`` naming the class.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, ClassVar

from raydist.errors import TrainingConfigError

__all__ = ["HorovodParams"]

_NOT_SAVED = ("backend", "store")


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


class HorovodParams:
    """Keyword parameters with Horovod's getters, setters and persistence."""

    #: name: default, for every parameter the class takes.
    _defaults: ClassVar[dict[str, Any]] = {}
    #: Horovod's names for getters that differ from the parameter's (``getFeatureColumns``).
    _aliases: ClassVar[dict[str, str]] = {}
    #: Whether ``loss`` and ``loss_constructors`` exclude each other here (Horovod's
    #: PyTorch estimators refuse both at construction; their models take what they are given).
    _one_loss: ClassVar[bool] = False

    def __init__(self, **params: Any) -> None:
        if self._one_loss and params.get("loss") is not None \
                and params.get("loss_constructors") is not None:  # Horovod's rule, with its message
            raise ValueError("only one of loss_constructors and loss parameters can be specified.")
        super().__init__()  # Spark ML's Params, where the class is an Estimator or a Model too
        unknown = sorted(set(params) - set(self._defaults))
        if unknown:
            raise TrainingConfigError(unknown[0], params[unknown[0]],
                                      f"not a parameter of {type(self).__name__}; it takes {sorted(self._defaults)}")
        self._hvd_params: dict[str, Any] = {**self._defaults, **params}
        self._hvd_names = {_camel(n): n for n in self._defaults} | self._aliases

    def __getattr__(self, attr: str) -> Any:
        names = self.__dict__.get("_hvd_names", {})
        if attr.startswith(("get", "set")) and attr[3:] in names:
            name = names[attr[3:]]
            if attr.startswith("get"):
                return lambda: self._hvd_params[name]

            def setter(value: Any) -> HorovodParams:
                self._hvd_params[name] = value
                return self

            return setter
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")

    def setParams(self, **params: Any) -> HorovodParams:  # noqa: N802 - Horovod's name
        for name, value in params.items():
            getattr(self, "set" + _camel(name))(value)
        return self

    def copy_with(self, **changes: Any) -> HorovodParams:
        """A copy of this object with ``changes`` applied (what Spark ML's ``copy(extra)`` does)."""
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        twin._hvd_params = {**self._hvd_params, **changes}
        return twin

    # what fit checks, in Horovod's words where it has them ---------------------------

    def _check_given(self, *names: str) -> None:
        for name in names:
            if self._hvd_params[name] is None:
                raise TrainingConfigError(name, None, f"{type(self).__name__} needs {name}")

    def _check_whole(self, *names: str) -> None:
        for name in names:
            value = self._hvd_params[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TrainingConfigError(name, value, "expected a whole number of at least 1")

    def _check_one_shape_each(self, shapes_param: str, columns_param: str, what: str) -> None:
        shapes = self._hvd_params[shapes_param]
        if shapes is not None and len(shapes) != len(self._hvd_params[columns_param] or ()):
            raise TrainingConfigError(shapes_param, shapes, f"expected one shape per {what} column")

    def _name_outputs(self) -> None:
        """A model's prediction columns, by Horovod's default: ``<label>__output``."""
        if self._hvd_params.get("label_columns") and not self._hvd_params.get("output_cols"):
            self._hvd_params["output_cols"] = [f"{c}__output" for c in self._hvd_params["label_columns"]]

    # persistence ------------------------------------------------------------------

    def save(self, path: str) -> None:
        """Write this object to the directory ``path`` (it must not exist)."""
        self.write().save(path)

    def write(self) -> _Writer:
        return _Writer(self)

    def _state(self) -> dict[str, Any]:
        return {k: v for k, v in self._hvd_params.items() if k not in _NOT_SAVED}

    def _restore(self, state: dict[str, Any]) -> None:
        self._hvd_params.update(state)

    @classmethod
    def load(cls, path: str) -> Any:
        """The object saved at ``path``."""
        from pyspark import cloudpickle

        with open(os.path.join(path, "class.json"), encoding="utf-8") as f:
            saved = json.load(f)["class"]
        if saved != f"{cls.__module__}.{cls.__qualname__}":
            raise TrainingConfigError("path", path, f"holds a {saved}, not a {cls.__qualname__}: "
                                                    f"load it with that class")
        with open(os.path.join(path, "params.pkl"), "rb") as f:
            state = cloudpickle.load(f)
        obj = cls()
        obj._restore(state)
        return obj

    @classmethod
    def read(cls) -> _Reader:
        return _Reader(cls)


class _Writer:
    def __init__(self, obj: HorovodParams) -> None:
        self._obj, self._overwrite = obj, False

    def overwrite(self) -> _Writer:
        self._overwrite = True
        return self

    def save(self, path: str) -> None:
        from pyspark import cloudpickle

        path = path[len("file://"):] if path.startswith("file://") else path
        if os.path.exists(path):
            if not self._overwrite:
                raise FileExistsError(f"{path} already exists: call write().overwrite().save(path) to replace it")
            shutil.rmtree(path)
        os.makedirs(path)
        cls = type(self._obj)
        with open(os.path.join(path, "class.json"), "w", encoding="utf-8") as f:
            json.dump({"class": f"{cls.__module__}.{cls.__qualname__}"}, f)
        with open(os.path.join(path, "params.pkl"), "wb") as f:
            cloudpickle.dump(self._obj._state(), f)


class _Reader:
    def __init__(self, cls: type[HorovodParams]) -> None:
        self._cls = cls

    def load(self, path: str) -> Any:
        return self._cls.load(path)
