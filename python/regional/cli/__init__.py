"""``python -m regional status <checkpoint>`` and ``python -m regional build-shim``."""

from __future__ import annotations

import argparse
import sys

from regional.errors import RegionalError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m regional", description="regional checkpoints for Spark")
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser("status", help="show a query's regions and epochs")
    show.add_argument("checkpoint", help="the query's checkpointLocation")
    commands.add_parser("build-shim", help="compile the JVM shim into the package (uses pyspark's Scala compiler)")
    args = parser.parse_args(argv)
    try:
        if args.command == "build-shim":
            from regional.spark.shim import build

            print(f"built {build()}")
        else:
            from regional.cli.status import status

            print(status(args.checkpoint).render())
    except RegionalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
