"""``source=generator``: deterministic rows for tests and benchmarks.

Options: ``regions`` (how many, ids ``g000``, ``g001``, ...), ``rowsPerEpoch`` (records that become
available per region per epoch), ``totalRows`` (per region; makes the source bounded) and
``valueSize`` (pad values to this size). ``value`` is a function of region and offset.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa

from regional.inputs.base import BATCH_ROWS, RegionInput
from regional.inputs.files import SCHEMA, SCHEMA_DDL, batch_of
from regional.options import Option, OptionTable
from regional.protocol.settings import parse_int, parse_optional_int

OPTIONS = OptionTable("source=generator", [
    Option("regions", "4", "How many regions (ids `g000`, `g001`, ...)."),
    Option("rowsPerEpoch", "100", "Records that become available per region per epoch."),
    Option("totalRows", "", "Records per region in all; makes the source bounded."),
    Option("valueSize", "0", "Pad each value to this many characters."),
])


def create(options: dict[str, str]) -> GeneratorInput:
    return GeneratorInput(options)


class GeneratorInput(RegionInput[None]):
    schema = SCHEMA
    schema_ddl = SCHEMA_DDL

    def __init__(self, options: Mapping[str, str]) -> None:
        count = parse_int(options, "regions", minimum=1, default="4")
        width = max(3, len(str(count - 1)))
        self.regions = [f"g{i:0{width}d}" for i in range(count)]
        self.rows_per_epoch = parse_int(options, "rowsPerEpoch", minimum=1, default="100")
        self.total_rows = parse_optional_int(options, "totalRows", minimum=0)
        self.value_size = parse_int(options, "valueSize", minimum=0, default="0")

    def ends(self) -> dict[str, int] | None:
        return None if self.total_rows is None else dict.fromkeys(self.regions, self.total_rows)

    def available(self, epoch: int) -> dict[str, int]:
        n = (epoch + 1) * self.rows_per_epoch
        if self.total_rows is not None:
            n = min(n, self.total_rows)
        return dict.fromkeys(self.regions, n)

    def split(self, region: str, start: int, end: int) -> None:
        return None

    def read(self, region: str, start: int, end: int, split: Any,
             batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        for chunk in range(start, end, batch_rows):
            chunk_end = min(chunk + batch_rows, end)
            values = [generated_value(region, o, self.value_size) for o in range(chunk, chunk_end)]
            yield batch_of(region, chunk, pa.array(values, pa.string()))


def generated_value(region: str, offset: int, size: int = 0) -> str:
    value = f"{region}:{offset}"
    return value.ljust(size, ".") if size > len(value) else value
