"""The JVM shim (``jvm-shim/``) in a session: loading it, and what is off without it.

The jar ships inside the package (``regional/jars/regional-shim.jar``), built
from the Scala sources with the Scala compiler that pyspark itself ships::

    python -m regional build-shim

What it adds, and what is off without it (``register`` says which):

- keep-alive of Spark's ``offsets/N`` and ``commits/N`` while a ref_epoch is N
  (a checkpoint file manager, ``spark.sql.streaming.checkpointFileManagerClass``);
- failure causes of task attempts in the epoch records (a SparkListener);
- plan checks at query start, and ``checkpointLocation`` given once, on
  writeStream (``spark.sql.extensions``, which Spark reads only when a session starts);
- writeStream's regional settings recorded in the store at query start (a JVM listener; it works over Spark
  Connect, where the client has no py4j).

With the extension configured, the shim installs itself into every session at its first query plan, so a
Spark Connect server needs only the jar and the extension (``connect_state``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from regional.errors import RegionalConfigError
from regional.shim_jar import SHIM_JAR, ensure_built

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("regional")

EXTENSION = "io.regional.shim.RegionalExtensions"
FILE_MANAGER = "io.regional.shim.RegionalCheckpointFileManager"
FILE_MANAGER_CONF = "spark.sql.streaming.checkpointFileManagerClass"
INSTALLED_CONF = "regional.shim.installed"  # RegionalShim.InstalledConf: set where the shim is installed
# Spark lines the shim is compiled against; RegionalShim.SupportedSparkLines says the same on the JVM side.
SUPPORTED_SPARK_LINES = ("4.2",)

FEATURES = {
    "keep_alive": "offset-log keep-alive of referenced epochs",
    "failure_causes": "failure causes in epoch records",
    "plan_checks": "plan checks at query start",
    "one_checkpoint": "checkpointLocation given only on writeStream",
}


def supports(version: str) -> bool:
    """Whether the shim was built for this Spark version's line."""
    return any(version == line or version.startswith(line + ".") for line in SUPPORTED_SPARK_LINES)


def check_spark_version(version: str) -> None:
    """The version switch: refuse a Spark the shim was not built for, with what to do."""
    if supports(version):
        return
    moved = " (Spark 4.1 moved the streaming internals the shim hooks between packages)"
    raise RegionalConfigError(
        f"regional's JVM shim supports Spark {', '.join(SUPPORTED_SPARK_LINES)}.x and this session runs Spark "
        f"{version}{moved}. Install the pyspark that regional pins (see setup.cfg), or start the session "
        "without the shim jar in spark.jars to run regional in pure Python"
    )


@dataclass(frozen=True)
class ShimState:
    """What of the shim a session has: ``on`` lists the features in effect."""

    loaded: bool
    on: frozenset[str]
    advice: str | None  # what to set, when something is off

    @property
    def off(self) -> list[str]:
        return [FEATURES[f] for f in FEATURES if f not in self.on]


def session_conf() -> dict[str, str]:
    """The conf a session needs, at start, for the whole shim; none on a Spark it was not built for (the session
    then starts, and regional runs in pure Python)."""
    import pyspark

    if not supports(pyspark.__version__):
        log.warning("regional: the JVM shim is left out of the session: it supports Spark %s.x and pyspark is %s. "
                    "regional runs in pure Python: give readStream the same checkpointLocation as writeStream",
                    ", ".join(SUPPORTED_SPARK_LINES), pyspark.__version__)
        return {}
    jar = ensure_built()
    if jar is None:
        return {}
    return {"spark.jars": str(jar), "spark.sql.extensions": EXTENSION}


def server_command_conf() -> str:
    """What a Spark Connect server needs for the shim, as spark-submit arguments."""
    return f"--jars {SHIM_JAR} --conf spark.sql.extensions={EXTENSION} (next to any other extensions)"


def connect_state(spark: SparkSession) -> ShimState:
    """The shim of a Spark Connect server, seen from a client without py4j: its extension must be configured
    on the server (it installs the shim into every session there); without it regional cannot run over
    Connect, since only the shim records writeStream's settings where the query runs."""
    extensions = [e.strip() for e in (spark.conf.get("spark.sql.extensions", "") or "").split(",")]
    if EXTENSION not in extensions:
        raise RegionalConfigError(
            "over Spark Connect regional needs its JVM shim on the server, and this server's spark.sql.extensions "
            f"lacks {EXTENSION}: start the Connect server with `python -m regional.spark.connect`, or give its "
            f"spark-submit {server_command_conf()} (see README, 'Spark Connect')")
    check_spark_version(spark.version)
    _ = spark.range(0).schema  # an analysis on the server: the extension's check rule installs the shim there
    if not spark.conf.get(INSTALLED_CONF, None):
        raise RegionalConfigError(
            f"this Spark Connect server names {EXTENSION} in spark.sql.extensions, but the shim did not install "
            "itself (is its jar missing from the server's --jars / spark.jars? Spark then logs 'Cannot use "
            f"{EXTENSION} to configure session extensions' and starts without it): start the server with "
            f"`python -m regional.spark.connect`, or give its spark-submit {server_command_conf()}")
    on = set(FEATURES)
    advice = None
    manager = spark.conf.get(FILE_MANAGER_CONF, None)
    if manager != FILE_MANAGER:
        on.discard("keep_alive")
        advice = (f"spark.sql.streaming.checkpointFileManagerClass is {manager}, so Spark's offset-log purge may "
                  "delete entries a ref_epoch still needs")
    return ShimState(True, frozenset(on), advice)


def install(spark: SparkSession) -> ShimState:
    """Load the shim into ``spark`` as far as this session allows; never fails a session without it."""
    from py4j.java_gateway import JavaClass

    start_conf = (f".config('spark.jars', '{SHIM_JAR}') and "
                  f".config('spark.sql.extensions', '{EXTENSION}') (next to any other extensions)")
    shim = spark._jvm.io.regional.shim.RegionalShim  # type: ignore[union-attr]
    if not isinstance(shim, JavaClass):
        return ShimState(False, frozenset(), f"the JVM shim is not on the driver's classpath; start the session with "
                                             f"{start_conf}, or use regional.local_spark()")
    check_spark_version(spark.version)
    on = {"failure_causes"}
    advice = []
    manager = shim.install(spark._jsparkSession)
    if manager == FILE_MANAGER:
        on.add("keep_alive")
    else:
        advice.append(f"spark.sql.streaming.checkpointFileManagerClass is {manager}, so Spark's offset-log purge "
                      "may delete entries a ref_epoch still needs")
    extensions = [e.strip() for e in (spark.conf.get("spark.sql.extensions", "") or "").split(",")]
    if EXTENSION in extensions:
        on |= {"plan_checks", "one_checkpoint"}
    else:
        advice.append(f"spark.sql.extensions lacks {EXTENSION}; Spark reads it only when a session starts: "
                      f"start the session with {start_conf}")
    return ShimState(True, frozenset(on), "; ".join(advice) or None)
