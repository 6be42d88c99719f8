"""target=delta's parquet files: one a task stages in the table's location, and the encodings it chooses."""

from __future__ import annotations

import contextlib
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from regional.storage import Storage
from regional.targets.delta.stats import FileStats

DICTIONARY_SAMPLE_ROWS = 1000  # a staged file's first rows, which choose the columns it dictionary-encodes


class StagedFile:
    """One parquet file a task writes into the table's location: one per partition value of a partitioned table,
    else one per slice. It exists, whole, once closed; a discarded one never appears."""

    def __init__(self, storage: Storage, prefix: str, schema: pa.Schema, compression: str = "snappy",
                 stats: FileStats | None = None) -> None:
        self.name = f"{prefix}-{uuid.uuid4().hex[:12]}.parquet"
        self.storage = storage
        self.stats = stats if stats is not None else FileStats(None, schema)  # of exactly the rows written
        self.rows = 0
        self.size = 0
        self.closed = False
        self._file = storage.open_writer(self.name)
        self._schema, self._compression = schema, compression
        self._writer: pq.ParquetWriter | None = None  # opened at the first rows, which choose its dictionaries

    def _opened(self, first: pa.RecordBatch | None) -> pq.ParquetWriter:
        if self._writer is None:
            dictionary = True if first is None else _dictionary_columns(first)
            self._writer = pq.ParquetWriter(self._file, self._schema, compression=self._compression,
                                            use_dictionary=dictionary)
        return self._writer

    def write(self, batch: pa.RecordBatch) -> None:
        self._opened(batch).write_batch(batch)
        self.stats.add(batch)
        self.rows += batch.num_rows

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._opened(None).close()  # the parquet footer; the file object stays open
        self.size = self._file.tell()
        self._file.close()

    def discard(self) -> None:
        with contextlib.suppress(Exception):  # the footer, into the file that is then dropped unfinished
            if self._writer is not None:
                self._writer.close()
        self.storage.discard(self._file)


def _dictionary_columns(first: pa.RecordBatch) -> bool | list[str]:
    """The columns a file dictionary-encodes: those whose values repeat among its first rows. A column of mostly
    distinct values (ids, times, payloads) fills the dictionary to its page limit, then falls back to plain
    encoding anyway, after hashing every value on the way: 39% of the Parquet time of benchmark K1's files
    (measured), and larger files. A file whose first rows are too few to tell, or with nested or dictionary-typed
    columns, keeps pyarrow's default (every column)."""
    if first.num_rows < DICTIONARY_SAMPLE_ROWS or any(pa.types.is_nested(f.type) or pa.types.is_dictionary(f.type)
                                                      for f in first.schema):
        return True
    sample = first.slice(0, DICTIONARY_SAMPLE_ROWS)
    return [name for name, column in zip(sample.schema.names, sample.columns, strict=True)
            if _repeats(column, sample.num_rows)]


def _repeats(column: pa.Array, rows: int) -> bool:
    """Whether at most half of ``column``'s values differ; a type Arrow cannot count (null, views, extension
    types: a Spark NullType column is Arrow's null) keeps its dictionary, as every column did before."""
    try:
        return bool(pc.count_distinct(column, mode="all").as_py() * 2 <= rows)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return True
