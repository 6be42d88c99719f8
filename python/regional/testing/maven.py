"""Jars from Maven Central for the tests' servers and Spark's connectors, fetched once with Maven into a cache
outside the repository (``~/.cache/regional``, or ``REGIONAL_CACHE``) and reused."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from regional.machine_lock import held

CACHE = Path(os.environ.get("REGIONAL_CACHE", Path.home() / ".cache" / "regional"))

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>regional</groupId><artifactId>{name}</artifactId><version>1</version>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""
_DEPENDENCY = """    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>
      <version>{version}</version>{classifier}{exclusions}</dependency>"""
_NO_TRANSITIVE = "<exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions>"


def fetch(name: str, coordinates: Sequence[str], transitive: bool = True) -> Path:
    """The directory of the jars of ``coordinates`` (``group:artifact:version[:classifier]``), and of their
    runtime dependencies if ``transitive``, fetched into ``<cache>/<name>/lib`` on first use."""
    home = CACHE / name
    lib = home / "lib"
    if (home / "complete").exists():
        return lib
    # One Maven at a time: parallel test workers share the cache and Maven's local repository.
    with held(CACHE / "maven.lock"):
        if (home / "complete").exists():  # fetched by another process while this one waited
            return lib
        return _fetch(name, coordinates, transitive, home, lib)


def _fetch(name: str, coordinates: Sequence[str], transitive: bool, home: Path, lib: Path) -> Path:
    if shutil.which("mvn") is None:
        raise RuntimeError(f"the jars of {name} are fetched with Maven: install Maven (apt-get install maven)")
    dependencies = []
    for coordinate in coordinates:
        group, artifact, version, *rest = coordinate.split(":")
        classifier = f"<classifier>{rest[0]}</classifier>" if rest else ""
        dependencies.append(_DEPENDENCY.format(group=group, artifact=artifact, version=version,
                                               classifier=classifier,
                                               exclusions="" if transitive else _NO_TRANSITIVE))
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{name}-jars-", dir=CACHE))
    (work / "pom.xml").write_text(_POM.format(name=name, dependencies="\n".join(dependencies)))
    subprocess.run(["mvn", "-q", "-B", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
                    "-DincludeScope=runtime", f"-DoutputDirectory={work / 'lib'}"], check=True,
                   stdout=subprocess.DEVNULL)
    if lib.exists():
        shutil.rmtree(lib)
    home.mkdir(parents=True, exist_ok=True)
    (work / "lib").rename(lib)
    shutil.rmtree(work, ignore_errors=True)
    (home / "complete").write_text("\n".join(coordinates))
    return lib
