"""The JVM shim's jar (``jvm-shim/``): where it is, and building it with the Scala compiler that pyspark
ships (``python -m regional build-shim``). No SparkSession: loading it into one is ``regional.spark.shim``."""

from __future__ import annotations

import os
import subprocess
import tempfile
import zipfile
from pathlib import Path

from regional.errors import RegionalConfigError

SHIM_JAR = Path(__file__).resolve().parent / "jars" / "regional-shim.jar"
SHIM_SOURCES = Path(__file__).resolve().parents[2] / "jvm-shim" / "src" / "main" / "scala"
# The shim records writeStream's regional settings at query start and nothing else of its options (a target's
# credentials stay out of the store): it reads their keys from this resource, written from the one list of them.
SETTING_KEYS_RESOURCE = "io/regional/shim/setting-keys.txt"
SETTINGS_SOURCE = Path(__file__).resolve().parent / "protocol" / "settings.py"


def pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def build(out: Path = SHIM_JAR, sources: Path = SHIM_SOURCES) -> Path:
    """Compile the shim with pyspark's bundled Scala 2.13 compiler, against pyspark's jars."""
    scala_files = sorted(sources.rglob("*.scala"))
    if not scala_files:
        raise RegionalConfigError(f"no Scala sources under {sources}: build the shim from a clone of regional")
    jars = pyspark_jars()
    compiler = [next(jars.glob(f"{name}-2.13.*.jar"), None) for name in ("scala-compiler", "scala-library",
                                                                        "scala-reflect")]
    if any(c is None for c in compiler):
        raise RegionalConfigError(f"pyspark's jars at {jars} lack the Scala 2.13 compiler; build with Maven instead "
                                  "(see jvm-shim/README.md)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        jar = Path(tmp) / out.name
        command = ["java", "-cp", os.pathsep.join(map(str, compiler)), "scala.tools.nsc.Main",
                   "-classpath", str(jars / "*"), "-d", str(jar), *map(str, scala_files)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0 or not jar.exists():
            raise RegionalConfigError(f"building the JVM shim failed:\n{result.stdout}{result.stderr}")
        with zipfile.ZipFile(jar, "a") as archive:
            archive.writestr(SETTING_KEYS_RESOURCE, setting_keys_text())
        os.replace(jar, out)
    return out


def setting_keys_text() -> str:
    from regional.protocol.settings import DEFAULTS

    return "".join(f"{key}\n" for key in DEFAULTS)


def ensure_built() -> Path | None:
    """The shim jar, rebuilt when its sources (or the list of setting keys) are newer; None when neither jar nor
    sources exist."""
    sources = sorted(SHIM_SOURCES.rglob("*.scala")) if SHIM_SOURCES.is_dir() else []
    if sources:
        sources.append(SETTINGS_SOURCE)
    if SHIM_JAR.exists() and all(s.stat().st_mtime <= SHIM_JAR.stat().st_mtime for s in sources):
        return SHIM_JAR
    if sources:
        return build()
    return None
