"""A Spark Connect server that regional's clients can use: pyspark's own ``SparkConnectServer`` (pyspark 4.2
ships ``spark-connect_2.13``), started with ``spark-submit`` and ``regional_conf`` (the JVM shim and its
extension, Delta Lake); ``python -m regional.spark.connect`` runs one in the foreground.

Over Spark Connect the client has no JVM: the query runs in the server, and the shim's listener records
writeStream's regional settings there at query start (see ``shim.connect_state``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002  # Spark Connect's own default (spark.connect.grpc.binding.port)


def spark_home() -> Path:
    """pyspark's installation, which is a Spark distribution (``bin/spark-submit``, ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).parent


def server_command(master: str = "local[2,3]", host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                   conf: Mapping[str, str] | None = None) -> list[str]:
    """``spark-submit`` arguments that start a Spark Connect server on ``host:port`` with regional's conf
    merged into ``conf``. It listens on loopback unless ``host`` says otherwise: Spark Connect has no
    authentication of its own, so put it behind a proxy that has before binding it to other hosts."""
    from regional.spark.session import regional_conf

    given = {"spark.connect.grpc.binding.address": host, "spark.connect.grpc.binding.port": str(port),
             **(conf or {})}
    merged = {**given, **regional_conf(given, master)}
    command = [str(spark_home() / "bin" / "spark-submit"), "--master", master, "--class", SERVER_CLASS,
               "--name", "Spark Connect server (regional)"]
    for key, value in merged.items():
        command += ["--conf", f"{key}={value}"]
    return [*command, "spark-internal"]


def server_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for ``server_command``: pyspark's Spark, and this interpreter for Python workers (the
    regional source and sink run in the server's Python workers, which must import regional)."""
    env = dict(os.environ if base is None else base)
    env.setdefault("SPARK_HOME", str(spark_home()))
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return env


def run_server(master: str, host: str, port: int, conf: Mapping[str, str]) -> NoReturn:
    """Runs the server in this process's place (``exec``)."""
    command = server_command(master, host, port, conf)
    print(f"regional: Spark Connect server on sc://{host}:{port} (Ctrl-C stops it)", flush=True)
    os.execve(command[0], command, server_env())


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m regional.spark.connect",
                                     description="run a Spark Connect server with regional's shim and Delta")
    # local[*] would give each task one attempt: no attempt left to quarantine a failing region (regionAttempts=2).
    parser.add_argument("--master", default="local[2,3]",
                        help="the server's Spark master (default local[2,3]: three attempts per task)")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the port (default {DEFAULT_PORT})")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="more Spark conf")
    args = parser.parse_args(argv)
    bad = [item for item in args.conf if "=" not in item]
    if bad:
        parser.error(f"--conf takes KEY=VALUE, not {bad[0]!r}")
    run_server(args.master, args.host, args.port, dict(item.split("=", 1) for item in args.conf))


if __name__ == "__main__":
    main()
