"""regional as users install it: the sdist and the wheel of ``pyspark-regional`` built with ``python -m build`` from
this checkout and checked with ``twine check`` (as PyPI would take them), the wheel installed with the kafka and
postgres extras into a fresh venv, and the demo run from a directory outside the repository with nothing of the
source tree on its path (the wheel carries the JVM shim jar: no Scala compiler on the user's side)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from integration.helpers import ROOT

SHIM_IN_WHEEL = "regional/jars/regional-shim.jar"
DISTRIBUTION = "pyspark-regional"  # on PyPI (`regional` there is another project); the import name is regional
DIST_FILES = "pyspark_regional"  # the distribution's name as wheel and sdist file names spell it


def run(command: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
    return result.stdout + result.stderr


@pytest.mark.campaign  # 50 s: the campaign command runs it (REGIONAL_CAMPAIGN=1), keeping CI within 30 minutes
def test_the_built_wheel_installs_into_a_fresh_venv_and_runs_the_demo_without_the_repo(tmp_path):
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], tmp_path, 600)
    [wheel] = dist.glob(f"{DIST_FILES}-*.whl")
    [sdist] = dist.glob(f"{DIST_FILES}-*.tar.gz")
    # The metadata as PyPI renders and checks it: the long description renders, nothing required is missing.
    checked = run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)], tmp_path, 120)
    assert checked.count("PASSED") == 2, checked
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert SHIM_IN_WHEEL in names and "regional/py.typed" in names, sorted(names)[:20]
        assert "io/regional/shim/setting-keys.txt" in zipfile.ZipFile(archive.open(SHIM_IN_WHEEL)).namelist()
        [info] = {n.split("/")[0] for n in names if ".dist-info/" in n}
        metadata = archive.read(f"{info}/METADATA").decode()
        assert f"{info}/licenses/LICENSE" in names and "pyspark_regional.py" in names, sorted(names)[:20]
    fields = [line.split(": ", 1) for line in metadata.split("\n\n", 1)[0].splitlines() if ": " in line]
    assert ["Name", DISTRIBUTION] in fields and ["License-Expression", "Apache-2.0"] in fields, fields
    assert ["Description-Content-Type", "text/markdown"] in fields, fields
    classifiers = {value for key, value in fields if key == "Classifier"}
    assert "Programming Language :: Python :: 3.11" in classifiers, classifiers
    assert any(c.startswith("Development Status :: ") for c in classifiers), classifiers
    assert "LICENSE" in {Path(n).name for n in tarfile.open(sdist).getnames()}

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], tmp_path, 120)
    python = str(venv / "bin" / "python")
    run([python, "-m", "pip", "install", "-q", f"{wheel}[kafka,postgres]"], tmp_path, 900)
    shown = run([python, "-m", "pip", "show", DISTRIBUTION], tmp_path, 120)
    assert f"Name: {DISTRIBUTION}" in shown, shown

    elsewhere = tmp_path / "user"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME")}
    where = run([python, "-c", "import regional, confluent_kafka, psycopg; print(regional.__file__)"], elsewhere, 120,
                env)
    assert where.strip().startswith(str(venv)), where
    out = run([python, "-m", "regional.demo"], elsewhere, 600, env)
    assert "OK: the Delta table at" in out and "exactly once" in out, out[-2000:]
    assert "pure Python" not in out  # the shim jar came with the wheel and loaded
