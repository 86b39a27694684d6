"""[Experimental] ``horovod.spark.common.store``: where an estimator keeps a
run's checkpoints and logs.

Horovod's Store also holds the training data: ``fit`` writes the DataFrame
to Parquet under the Store and the workers read it back with Petastorm.
raydist's estimators hand each rank its rows through Ray's object store
instead (no files), so the Store keeps only what outlives the fit: each
run's checkpoint and logs under ``runs/<run_id>``, and the Parquet that
``fit_on_parquet`` reads. The layout is Horovod's:

    <prefix>/intermediate_train_data.<idx>   <prefix>/intermediate_val_data.<idx>
    <prefix>/runs/<run_id>/checkpoint.pt     <prefix>/runs/<run_id>/logs/

The prefix must be a path every Spark executor reaches (a local directory on
one machine; NFS or a mounted bucket across several). ``dbfs:/...`` is
Databricks' FUSE mount ``/dbfs/...``, as Horovod's ``DBFSLocalStore`` reads it.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from raydist.errors import TrainingConfigError

__all__ = ["Store", "FilesystemStore", "LocalStore", "DBFSLocalStore"]


class Store:
    """Horovod's abstract Store; :meth:`create` picks the kind from the prefix."""

    @staticmethod
    def create(prefix_path: str, *args: Any, **kwargs: Any) -> Store:
        """The Store for ``prefix_path``: local paths and ``file://`` URLs
        (:class:`LocalStore`), ``dbfs:/`` (:class:`DBFSLocalStore`). HDFS and
        other remote filesystems are refused with the fix."""
        if not isinstance(prefix_path, str) or not prefix_path:
            raise TrainingConfigError("prefix_path", prefix_path, "expected a directory path")
        if DBFSLocalStore.matches(prefix_path):
            return DBFSLocalStore(prefix_path, *args, **kwargs)
        scheme = prefix_path.split("://", 1)[0] if "://" in prefix_path else ""
        if scheme and scheme != "file":
            raise TrainingConfigError(
                "prefix_path", prefix_path,
                f"raydist's Store keeps checkpoints and logs on a filesystem path every executor reaches; "
                f"{scheme}:// is not one: mount it (or use NFS) and give the mounted path")
        return LocalStore(prefix_path, *args, **kwargs)


class FilesystemStore(Store):
    """A Store on a filesystem path (Horovod's ``FilesystemStore``)."""

    def __init__(self, prefix_path: str, train_path: str | None = None, val_path: str | None = None,
                 test_path: str | None = None, runs_path: str | None = None, save_runs: bool = True,
                 **_kwargs: Any) -> None:
        self.prefix_path = self._local(prefix_path)
        self._train_path = train_path or os.path.join(self.prefix_path, "intermediate_train_data")
        self._val_path = val_path or os.path.join(self.prefix_path, "intermediate_val_data")
        self._test_path = test_path or os.path.join(self.prefix_path, "intermediate_test_data")
        self._runs_path = runs_path or os.path.join(self.prefix_path, "runs")
        self._save_runs = save_runs

    @staticmethod
    def _local(path: str) -> str:
        return os.path.abspath(path[len("file://"):] if path.startswith("file://") else path)

    # Horovod's paths ----------------------------------------------------------

    def get_train_data_path(self, idx: Any = None) -> str:
        return f"{self._train_path}.{idx}" if idx is not None else self._train_path

    def get_val_data_path(self, idx: Any = None) -> str:
        return f"{self._val_path}.{idx}" if idx is not None else self._val_path

    def get_test_data_path(self, idx: Any = None) -> str:
        return f"{self._test_path}.{idx}" if idx is not None else self._test_path

    def get_runs_path(self) -> str:
        return self._runs_path

    def get_run_path(self, run_id: str) -> str:
        return os.path.join(self._runs_path, run_id)

    def get_checkpoint_path(self, run_id: str) -> str:
        return self.get_run_path(run_id)

    def get_checkpoint_filename(self) -> str:
        return "checkpoint.pt"

    def get_logs_path(self, run_id: str) -> str:
        return os.path.join(self.get_run_path(run_id), self.get_logs_subdir())

    def get_logs_subdir(self) -> str:
        return "logs"

    @property
    def saving_runs(self) -> bool:
        return self._save_runs

    # files ----------------------------------------------------------------------

    def exists(self, path: str) -> bool:
        return os.path.exists(self._local(path))

    def read(self, path: str) -> bytes:
        with open(self._local(path), "rb") as f:
            return f.read()

    def write(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` whole: a reader sees the old file or the new one."""
        path = self._local(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.partial-{os.getpid()}"
        with open(partial, "wb") as f:
            f.write(data)
        os.replace(partial, path)

    def is_parquet_dataset(self, path: str) -> bool:
        path = self._local(path)
        return os.path.isdir(path) and any(name.endswith(".parquet") for name in os.listdir(path))

    def get_parquet_dataset(self, path: str) -> str:
        return self._local(path)

    def delete_run(self, run_id: str) -> None:
        shutil.rmtree(self.get_run_path(run_id), ignore_errors=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.prefix_path!r})"


class LocalStore(FilesystemStore):
    """A Store on this machine's filesystem (Horovod's ``LocalStore``)."""


class DBFSLocalStore(FilesystemStore):
    """Databricks' DBFS through its FUSE mount: ``dbfs:/x`` is ``/dbfs/x``."""

    @staticmethod
    def matches(prefix_path: str) -> bool:
        return prefix_path.startswith(("dbfs:/", "/dbfs/"))

    def __init__(self, prefix_path: str, *args: Any, **kwargs: Any) -> None:
        path = "/dbfs/" + prefix_path[len("dbfs:/"):].lstrip("/") if prefix_path.startswith("dbfs:/") else prefix_path
        if not os.path.isdir("/dbfs"):
            raise TrainingConfigError("prefix_path", prefix_path,
                                      "DBFS is read through its FUSE mount /dbfs, which this machine lacks: "
                                      "run on Databricks, or give a local or NFS path")
        super().__init__(path, *args, **kwargs)
