"""Each rank's own input, moved to it through Ray's object store.

A run over data hands each rank its own part (pyspark's
``_train_on_dataframe``: partition ``i`` to rank ``i``). The caller gives one
value per rank and a *stager*, a function that turns a rank's value into what
the job finds (files in a directory of its own, named in its environment).

The values are put into the object store once this process is connected, and
travel in-band, inside the run's own arguments, so Ray counts every holder
and frees them when the run is done; each worker fetches only its own rank's.
The stager runs in the worker itself, the one process of the rank that Ray
can reach (a warm worker's forked job cannot call Ray), and the directory is
removed when the job ends.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FrameInputs", "FrameStager", "RankInputs", "PutInputs", "staged"]

#: ``stage(value, directory) -> environment``: write a rank's value where its
#: job reads it; the variables that tell the job where.
Stager = Callable[[Any, str], Mapping[str, str]]


@dataclass(frozen=True)
class RankInputs:
    """One value per rank, and how a rank's job finds its own."""

    values: Sequence[Any]
    stage: Stager

    def put(self) -> PutInputs:
        """Into the object store of the cluster this process is connected to."""
        import ray

        return PutInputs([ray.put(v) for v in self.values], self.stage)


#: ``stage(batches, directory, partition, partitions) -> environment``: in a
#: Spark task, write its partition's Arrow batches where the rank's job reads
#: them (raising what the caller's contract raises for a partition that will
#: not do: the wrong number of them, an empty one).
FrameStager = Callable[[Iterator[Any], str, int, int], Mapping[str, str]]


@dataclass(frozen=True)
class FrameInputs:
    """A DataFrame's partitions as the ranks' inputs, partition ``i`` to rank
    ``i``. A run in Spark's tasks runs over the DataFrame itself, each task
    staging the partition Spark computed there (no row passes through the
    driver, as in pyspark's ``_train_on_dataframe``); a run on Ray takes
    :meth:`collect`'s :class:`RankInputs`."""

    df: Any
    stage: FrameStager
    collect: Callable[[], RankInputs]


@dataclass(frozen=True)
class PutInputs:
    """:class:`RankInputs` in the object store: what a run's arguments carry."""

    refs: list[Any]
    stage: Stager


@contextlib.contextmanager
def staged(inputs: PutInputs | None, rank: int) -> Iterator[dict[str, str]]:
    """In a Ray worker: this rank's input written for its job (the
    environment that says where), removed again on the way out. No inputs:
    nothing to add."""
    if inputs is None:
        yield {}
        return
    import ray

    if rank >= len(inputs.refs):
        raise RuntimeError(f"the run has {len(inputs.refs)} inputs, none for rank {rank}")
    value = ray.get(inputs.refs[rank])
    where = tempfile.mkdtemp(prefix=f"raydist-rank{rank}-")
    try:
        yield dict(inputs.stage(value, where))
    finally:
        shutil.rmtree(where, ignore_errors=True)
