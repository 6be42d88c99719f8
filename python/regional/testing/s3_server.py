"""A real S3 API server on a loopback port, for tests and benchmarks (no Docker): s3proxy over jclouds'
``filesystem`` provider, each bucket a directory under the server's work directory.

s3proxy 4.1.0, not 2.6.0: 2.6.0 ignores ``If-None-Match`` and ``If-Match`` on PUT (it answers 200 and
overwrites), so nothing that relies on a conditional put (regional's store, delta-rs's commits) would be
tested against it; 4.1.0 answers 412 as S3 does (checked with curl, 2026-11-24).

``S3Server.spark_conf()`` is the conf a SparkSession needs to read and write ``s3a://`` there: the
hadoop-aws jars (fetched with Maven into ``~/.cache/regional``) and ``spark.hadoop.fs.s3a.*``, the same keys
regional's own storage takes (``regional.storage.config``).
"""

from __future__ import annotations

import atexit
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from regional.testing import maven
from regional.testing.kafka_broker import free_port
from regional.testing.processes import kill_group, stop_group

S3PROXY = "org.gaul:s3proxy:4.1.0:jar-with-dependencies"
# pyspark 4.2 ships hadoop-client 3.5.0; its s3a needs these (see SPARK_NOTES "Versions and storage").
S3A_JARS = ("org.apache.hadoop:hadoop-aws:3.5.0", "software.amazon.awssdk:bundle:2.35.4",
            "software.amazon.s3.analyticsaccelerator:analyticsaccelerator-s3:1.3.1")
ACCESS_KEY, SECRET_KEY = "regional-test", "regional-test-secret"  # any: authorization is off
START_TIMEOUT_S = 60.0


def s3proxy_jar() -> Path:
    return next(maven.fetch("s3proxy-4.1.0", [S3PROXY], transitive=False).glob("s3proxy-*.jar"))


def s3a_jars() -> list[Path]:
    return sorted(maven.fetch("hadoop-aws-3.5.0", S3A_JARS, transitive=False).glob("*.jar"))


class S3Server:
    """One s3proxy on 127.0.0.1; ``restart`` keeps the buckets."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = Path(workdir)
        self.data = self.workdir / "buckets"
        self.data.mkdir(parents=True, exist_ok=True)
        self.jar = s3proxy_jar()
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.properties = self.workdir / "s3proxy.properties"
        self.process: subprocess.Popen[bytes] | None = None
        self._write_properties()

    def _write_properties(self) -> None:
        self.properties.write_text("\n".join([
            f"s3proxy.endpoint={self.endpoint}",
            "s3proxy.authorization=none",
            "jclouds.provider=filesystem",
            f"jclouds.filesystem.basedir={self.data}",
            f"jclouds.identity={ACCESS_KEY}",
            f"jclouds.credential={SECRET_KEY}",
            "",
        ]))

    def start(self) -> S3Server:
        out = open(self.workdir / "s3proxy.out", "ab")
        self.process = subprocess.Popen(
            ["java", "-Xmx512m", "-jar", str(self.jar), "--properties", str(self.properties)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        atexit.register(self.kill)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._ready():
            if self.process.poll() is not None:
                raise RuntimeError(f"s3proxy exited with {self.process.returncode}; see {self.workdir}/s3proxy.out")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"s3proxy did not answer on {self.endpoint} within {START_TIMEOUT_S:.0f}s")
            time.sleep(0.1)
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint + "/", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def create_bucket(self, name: str) -> str:
        """A new bucket (a directory of the filesystem provider); returns ``s3a://<name>``."""
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=10):
            pass
        return f"s3a://{name}"

    def stop(self) -> None:
        stop_group(self.process, 20)
        self.process = None

    def kill(self) -> None:
        kill_group(self.process)
        self.process = None

    def restart(self, down_s: float = 0.0) -> None:
        """Stop the server, stay down ``down_s`` seconds, and start it again on the same port and buckets."""
        self.kill()
        time.sleep(down_s)
        self.start()

    def hadoop_conf(self) -> dict[str, str]:
        return hadoop_conf(self.endpoint)

    def spark_conf(self) -> dict[str, str]:
        return spark_conf(self.endpoint)


def upload_input(directory: Path, location: str) -> None:
    """The files source's input in ``directory`` (``<region>/<file>.txt``) to ``location``, one PUT per file."""
    from regional.location import parse_location
    from regional.storage import open_storage

    storage = open_storage(parse_location("in", location))
    for path in sorted(directory.rglob("*.txt")):
        storage.write(f"{path.parent.name}/{path.name}", path.read_bytes())


def hadoop_conf(endpoint: str) -> dict[str, str]:
    """``fs.s3a.*`` for the server (or a proxy in front of it) at ``endpoint``."""
    return {
        "fs.s3a.endpoint": endpoint,
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.endpoint.region": "us-east-1",
        "fs.s3a.access.key": ACCESS_KEY,
        "fs.s3a.secret.key": SECRET_KEY,
    }


def spark_conf(endpoint: str) -> dict[str, str]:
    """The SparkSession conf for ``s3a://`` at ``endpoint``: the jars and ``spark.hadoop.fs.s3a.*``."""
    conf = {f"spark.hadoop.{key}": value for key, value in hadoop_conf(endpoint).items()}
    # On the class path, not in spark.jars: Spark copies spark.jars into a temporary directory per driver (743 MB
    # with the AWS SDK bundle), which a driver killed with SIGKILL never removes.
    jars = ":".join(str(p) for p in s3a_jars())
    conf["spark.driver.extraClassPath"] = jars
    conf["spark.executor.extraClassPath"] = jars
    return conf
