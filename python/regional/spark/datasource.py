"""``spark.readStream.format("regional")`` and ``df.writeStream.format("regional")``."""

from __future__ import annotations

from typing import ClassVar

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, DataSourceStreamWriter
from pyspark.sql.types import StructType

from regional.inputs import load_input


class RegionalDataSource(DataSource):
    """``register()`` builds a subclass whose ``conf_defaults`` carry the session's ``spark.regional.*``
    conf to wherever Spark builds the reader and writer."""

    conf_defaults: ClassVar[dict[str, str]] = {}

    @classmethod
    def name(cls) -> str:
        return "regional"

    def schema(self) -> str:
        from regional.spark.reader import check_read_options

        source = load_input(self.options)
        check_read_options(source, self.options)  # at .load(), where Spark shows the message as it is
        return source.decide_schema()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from regional.spark.reader import RegionalStreamReader

        return RegionalStreamReader(self.conf_defaults, self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from regional.spark.worker_process import freeze_imports
        from regional.spark.writer import RegionalStreamWriter

        freeze_imports()  # Spark builds the writer for every epoch, in a reused worker it then collects (gc)
        return RegionalStreamWriter(self.conf_defaults, self.options, schema)
