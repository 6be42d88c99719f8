"""An outage is not poison: a service every region's UDF calls is down for a while. With deadLetterPath set, no
healthy record may be dead-lettered, the real poison record is, and everything else lands exactly once."""

from __future__ import annotations

import os
from pathlib import Path

from deltalake import DeltaTable
from pyspark.sql import functions as F

import regional
from integration.helpers import (
    add_epoch_of_files,
    assert_exactly_once,
    regional_stream,
    task_files_left,
    wait_for_epochs,
)

REGIONS = ["a", "b", "c"]


def service_udf(down_flag: Path, poison: set[str]):
    """Upper-cases through a 'service' that is down while ``down_flag`` exists (every record fails then), and
    raises on the records in ``poison`` always."""
    flag = str(down_flag)

    @F.udf("string")
    def call(value: str) -> str:
        if os.path.exists(flag):
            raise ConnectionError("the enrichment service is down")
        if value in poison:
            raise ValueError(f"poison record {value}")
        return value.upper()

    return call


def test_an_outage_of_every_region_dead_letters_nothing_healthy(spark, dirs, tmp_path):
    inp, out, ck = dirs
    dlq, down = tmp_path / "dead-letters", tmp_path / "service-down"
    inputs = add_epoch_of_files(inp, REGIONS, "001", 24)
    poison = {inputs["a"][7]}
    down.touch()
    df = regional_stream(spark, inp, ck)
    query = (df.select("region", "offset", service_udf(down, poison)("value").alias("value"))
             .writeStream.format("regional").option("target", "delta").option("path", str(out))
             .option("checkpointLocation", str(ck)).option("keepRegionColumns", "true")
             .option("deadLetterPath", str(dlq)).start())
    try:
        # long enough for bisection to reach single records (log2(24) + 2, about 7 epochs), were it to go on in an
        # outage (each outage epoch backs off, up to 10 s: the test's time is mostly these waits)
        wait_for_epochs(query, ck, 8, timeout=600)
        down.unlink()  # the service is back
        query.processAllAvailable()
    finally:
        query.stop()
    letters = DeltaTable(str(dlq)).to_pyarrow_table().to_pylist() if (dlq / "_delta_log").exists() else []
    assert [(r["region"], r["offset"]) for r in letters] == [("a", 7)]
    assert "poison record" in letters[0]["error"]
    expected = {r: [(o, v.upper()) for o, v in enumerate(values) if v not in poison] for r, values in inputs.items()}
    assert_exactly_once(out, expected, spark)
    epochs = regional.status(ck).epochs
    assert any(e.outage_epochs > 0 for e in epochs)  # the outage was seen, and backed off
    assert sum(s.dead_letters for s in regional.status(ck).regions.values()) == 1
    # The target's history says how regions fell back, never the messages (they often quote the record).
    history = str([h for h in DeltaTable(str(out)).history() if "regional" in h])
    assert "fallen_back" in history and "service is down" not in history and inputs["a"][7] not in history
    # The task files of every attempt, failed ones included, are gone with their epochs.
    assert task_files_left(spark, str(query.id)) == []
