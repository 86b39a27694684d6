"""A DataFrame's partitions as pyspark's ``_train_on_dataframe`` hands them to ranks.

pyspark runs one barrier task per partition and, before the training
function starts, writes the task's partition to a file as an Arrow stream
(``SPARK_PARTITION_ARROW_DATA_FILE``) and the DataFrame's schema as JSON
(``SPARK_DATAFRAME_SCHEMA_FILE``); the function reads them, usually through
``pyspark.ml.torch.distributor._get_spark_partition_data_loader``. Here one
Spark job turns each partition into that same Arrow stream (the bytes
pyspark's task would have written) before any training slot is taken; rank
``i`` gets partition ``i`` through Ray's object store
(:mod:`raydist.train._inputs`), and its worker writes the two files on its
own disk just before the function runs, with the same variables naming them.

That is the way of a run on Ray. A run in Spark's own tasks (the default
while the session cluster is not warm) needs no driver in between: its
barrier stage runs over the DataFrame itself, as pyspark's does, and each
task writes the partition Spark computed there (:func:`frame_inputs`).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from raydist.train.runtime import FrameInputs, RankInputs

__all__ = ["frame_inputs", "partition_inputs", "DATA_FILE_ENV", "SCHEMA_FILE_ENV", "PARTITIONS_MISMATCH",
           "EMPTY_PARTITION"]

#: pyspark's names (``pyspark.ml.torch.distributor``).
DATA_FILE_ENV = "SPARK_PARTITION_ARROW_DATA_FILE"
SCHEMA_FILE_ENV = "SPARK_DATAFRAME_SCHEMA_FILE"
#: pyspark's messages for the same mistakes.
PARTITIONS_MISMATCH = (
    "TorchDistributor._train_on_dataframe requires setting num_processes equal to input spark dataframe "
    "partition number."
)
EMPTY_PARTITION = "Empty Spark partition is not allowed in TorchDistributor.train_on_dataframe."

_STREAMS_SCHEMA = "part int, data binary"


def partition_inputs(df: Any, num_processes: int) -> RankInputs:
    """Each of ``df``'s partitions as rank ``i``'s input, in partition order.

    Raises ValueError with pyspark's message when ``df`` does not have
    exactly ``num_processes`` partitions or one of them is empty."""
    streams = sorted((int(r["part"]), bytes(r["data"])) for r in df.mapInArrow(_partition_stream, _STREAMS_SCHEMA)
                     .collect())
    if len(streams) != num_processes:
        raise ValueError(PARTITIONS_MISMATCH)
    if any(not data for _, data in streams):
        raise ValueError(EMPTY_PARTITION)
    schema = json.dumps(df.schema.jsonValue())
    return RankInputs([data for _, data in streams], functools.partial(_stage_partition, schema))


def frame_inputs(df: Any, num_processes: int) -> FrameInputs:
    """``df``'s partitions as the ranks' inputs, read where each run reads
    them: in its own Spark task, or collected for a run on Ray. The same
    refusals as :func:`partition_inputs`, raised in the task."""
    schema = json.dumps(df.schema.jsonValue())
    return FrameInputs(df, functools.partial(_stage_batches, schema, num_processes),
                       functools.partial(partition_inputs, df, num_processes))


def _write_stream(batches: Iterator[Any], sink: Any) -> None:
    """The batches as one Arrow stream (what pyspark's
    ``ArrowStreamSerializer.dump_stream`` writes): nothing for none."""
    import pyarrow as pa

    writer = None
    for batch in batches:
        if writer is None:
            writer = pa.ipc.new_stream(sink, batch.schema)
        writer.write_batch(batch)
    if writer is not None:
        writer.close()


def _stage_batches(schema_json: str, num_processes: int, batches: Iterator[Any], where: str, partition: int,
                   partitions: int) -> Mapping[str, str]:
    """In a Spark task of a run over the DataFrame: the two files pyspark's
    task writes, from the partition Spark computed here."""
    if partitions != num_processes:
        raise ValueError(PARTITIONS_MISMATCH)

    def write(f: Any) -> None:
        _write_stream(batches, f)
        if f.tell() == 0:
            raise ValueError(EMPTY_PARTITION)

    return _stage_files(schema_json, write, where)


def _partition_stream(batches: Iterator[Any]) -> Iterator[Any]:
    """In a Spark task: the partition's batches as one Arrow stream, one row."""
    import pyarrow as pa
    from pyspark import TaskContext

    sink = pa.BufferOutputStream()
    _write_stream(batches, sink)
    part = TaskContext.get().partitionId()
    yield pa.RecordBatch.from_pydict(
        {"part": [part], "data": [sink.getvalue().to_pybytes()]},
        schema=pa.schema([("part", pa.int32()), ("data", pa.binary())]),
    )


def _stage_partition(schema_json: str, data: bytes, where: str) -> Mapping[str, str]:
    """In the rank's worker: the two files pyspark's task writes."""
    return _stage_files(schema_json, lambda f: f.write(data), where)


def _stage_files(schema_json: str, write_data: Callable[[Any], object], where: str) -> Mapping[str, str]:
    """pyspark's two files in ``where`` (the data by ``write_data`` into the
    open file), and the variables that name them."""
    data_path = os.path.join(where, "data.arrow")
    with open(data_path, "wb") as f:
        write_data(f)
    schema_path = os.path.join(where, "schema.json")
    with open(schema_path, "w", encoding="utf-8") as f:
        f.write(schema_json)
    return {DATA_FILE_ENV: data_path, SCHEMA_FILE_ENV: schema_path}
