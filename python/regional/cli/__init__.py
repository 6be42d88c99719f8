"""``python -m regional``: ``status``, ``timeline``, ``dead-letters`` and ``build-shim``."""

from __future__ import annotations

import argparse
import sys

from regional.errors import RegionalError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m regional", description="regional checkpoints for Spark")
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser("status", help="a query's regions (state, offsets, lag, ref_epoch) and epochs")
    show.add_argument("checkpoint", help="the query's checkpointLocation")
    show.add_argument("--json", action="store_true", help="machine-readable: keys 'regions' and 'epochs'")
    show.add_argument("--watch", type=float, metavar="N", help="refresh in place every N seconds")
    show.add_argument("--epochs", type=int, default=20, metavar="K", help="show the newest K epochs (default 20)")
    draw = commands.add_parser("timeline", help="draw regions x epochs, coloured by outcome, with the lag")
    draw.add_argument("checkpoint", help="the query's checkpointLocation")
    draw.add_argument("-o", "--output", default="timeline.png", help="the PNG to write (default timeline.png)")
    draw.add_argument("--epochs", type=int, default=200, metavar="K", help="the newest K epochs (default 200)")
    letters = commands.add_parser("dead-letters", help="a dead-letter table: counts by region and error class, "
                                  "oldest and newest, how many are waiting for a replay")
    letters.add_argument("table", help="the dead-letter table (a query's deadLetterPath), or kafka:<topic> (its "
                                       "deadLetterTopic)")
    letters.add_argument("--json", action="store_true", help="machine-readable")
    letters.add_argument("--bootstrap-servers", help="a topic's brokers (host:9092)")
    letters.add_argument("--replay-group", help="a topic's replay group (default regional-replayed-<topic>)")
    letters.add_argument("-o", "--option", action="append", default=[], metavar="kafka.KEY=VALUE",
                         help="a consumer setting for a topic, as the replay takes it (repeatable)")
    commands.add_parser("build-shim", help="compile the JVM shim into the package (uses pyspark's Scala compiler)")
    args = parser.parse_args(argv)
    try:
        if args.command == "build-shim":
            from regional.shim_jar import build

            print(f"built {build()}")
        elif args.command == "dead-letters":
            from regional.cli.dead_letters import show as show_dead_letters

            if any("=" not in o for o in args.option):
                parser.error("--option takes kafka.KEY=VALUE")
            options = dict(o.split("=", 1) for o in args.option)
            if args.bootstrap_servers:
                options["kafka.bootstrap.servers"] = args.bootstrap_servers
            if args.replay_group:
                options["replayGroup"] = args.replay_group
            show_dead_letters(args.table, args.json, options)
        elif args.command == "timeline":
            from regional.cli.timeline import draw as draw_timeline
            from regional.store.status import status

            regional_checkpoint(args.checkpoint)
            print(f"wrote {draw_timeline(status(args.checkpoint, args.epochs), args.output)}")
        else:
            from regional.cli.status import show as show_status

            regional_checkpoint(args.checkpoint)
            show_status(args.checkpoint, args.json, args.epochs, args.watch)
    except RegionalError as exc:
        print(f"regional: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


def regional_checkpoint(checkpoint: str) -> None:
    """Fails with what to do unless ``checkpoint`` holds a regional store (a query id or epoch records): a path
    that does not exist, or the checkpoint of a query that does not write with regional, is not an empty query."""
    from regional.errors import RegionalConfigError
    from regional.store import Store

    store = Store(checkpoint)
    where = store.checkpoint
    if where.is_local and not where.local_path().is_dir():
        what = "is a file, not a directory" if where.local_path().exists() else "does not exist"
        raise RegionalConfigError(f"{where} {what}: give a query's checkpointLocation (the directory its "
                                  "writeStream was started with)")
    if store.query_id() is None and not store.epochs():
        if where.is_local and Store(where.local_path().parent).query_id() is not None:
            raise RegionalConfigError(f"{where} is the regional store inside a checkpoint: give the checkpoint, "
                                      f"{where.local_path().parent}")
        raise RegionalConfigError(
            f"{where} is not a regional checkpoint: it has no {store.location}/query.json and no epoch records. "
            "Give the checkpointLocation of a query that writes with format('regional'); a query that started "
            "a moment ago has them once its first epoch is planned, so try again in a few seconds")
