"""Connecting ``regional`` to a SparkSession: ``register``, and a local session for demos and tests."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pyspark_regional
from regional.errors import RegionalConfigError, RegionalError
from regional.protocol.settings import CONF_PREFIX, Settings, resolve_settings
from regional.spark import console, shim, start_check
from regional.store import EpochRecord, Standing, Store

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from regional.spark.listener import RegionalListener
    from regional.store.status import Progress

log = logging.getLogger("regional")

# Imported in every Python worker that runs regional's code (its source and sink, and pyspark's planner workers
# that unpickle its data source: regional/__init__ imports this module): idle workers end without printing
# pyspark's BrokenPipeError (see pyspark_regional).
pyspark_regional.quiet_idle_workers()

# Delta Lake's JVM artifact for the pinned pyspark (see setup.cfg), and the Spark line it is built for.
DELTA_PACKAGE = "io.delta:delta-spark_4.2_2.13:4.4.0"
DELTA_SPARK_LINE = "4.2"
EXIT_DRAIN_MS = 10_000
# Spark talks to its Python workers over loopback TCP by default, and every task of a Python source or sink
# stalled about 40 ms there: the JVM's small write after the command waits (Nagle) for an ACK the worker
# delays (delayed ACK). Over Unix domain sockets a task of 200 rows went from ~50 to ~10 ms (issue 31).
PYTHON_UNIX_SOCKETS = "spark.python.unix.domain.socket.enabled"
PYTHON_SOCKET_DIR = "spark.python.unix.domain.socket.dir"
# A socket's path is at most 107 bytes and Spark names it <dir>/.<uuid>.sock; Spark refuses a socket directory of
# more than 61 bytes, and a longer java.io.tmpdir fails every Python worker ("AF_UNIX path too long"). YARN's
# container temp directories are longer.
SOCKET_DIR_ROOM = 61

_listeners: dict[int, RegionalListener] = {}  # one per SparkSession
_shims: dict[int, shim.ShimState] = {}


def register(spark: SparkSession) -> None:
    """Register the ``regional`` data source with this session's ``spark.regional.*`` defaults.

    Works on a classic session and over Spark Connect (no py4j: the JVM shim must then be on the server, see
    docs/spark-connect.md). Calling it again is harmless, and picks up conf changed since.
    """
    from regional.spark.datasource import RegionalDataSource

    conf = {k: v for k, v in spark.conf.getAll.items() if k.lower().startswith(CONF_PREFIX)}
    policy = resolve_settings(conf, {}, {})  # bad conf fails here, not in a task

    connect = is_connect(spark)
    if not connect:
        _check_python(spark)
        _check_python_sockets(spark)
        _export_storage_conf(spark)
    _check_task_retries(spark, policy)
    state = shim.connect_state(spark) if connect else shim.install(spark)
    _shims[id(spark)] = state
    if state.off:
        pure = "" if state.loaded else " Until then regional runs in pure Python: give readStream the same " \
                                         "checkpointLocation as writeStream."
        log.warning("regional: %s. Off: %s.%s", state.advice, ", ".join(state.off), pure)
    source = type("RegionalDataSource", (RegionalDataSource,), {"conf_defaults": conf})
    spark.dataSource.register(source)
    start_check.install(spark, conf)  # writeStream's options checked at start(), before the query writes anything
    if id(spark) not in _listeners:  # Ctrl-C and a failed query: one line from regional, no py4j traceback; a
        console.install(lambda: spark.streams.active, _stop_on_signal)  # signal stops this session's queries
        from regional.spark.listener import RegionalListener

        # With the shim, its JVM listener records writeStream's settings at query start; this one then only
        # logs and ends bounded queries (over Spark Connect, pyspark 4.2 runs it in the client's process).
        _listeners[id(spark)] = RegionalListener(spark, record_settings=not state.loaded)
        spark.streams.addListener(_listeners[id(spark)])
        if connect:
            _at_thread_exit(lambda: _detach(spark))
        else:
            atexit.register(_detach, spark)


def _at_thread_exit(call: Callable[[], None]) -> None:
    """Run ``call`` when the main thread ends, before Python joins the threads that are not daemons.

    A Spark Connect client's listener bus is such a thread (pyspark 4.2 starts it, not as a daemon, with the first
    listener, and it waits for the server's events until the last listener is removed). ``atexit`` runs only after
    those threads are joined, so a script that ended without ``spark.stop()`` waited for ever; ``threading``'s own
    exit hooks run first (``threading._register_atexit``, what ``concurrent.futures`` uses), so removing the
    listener there ends the bus as ``spark.stop()`` would. Without that hook (another Python), ``atexit``."""
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        atexit.register(call)
        return
    try:
        register(call)
    except RuntimeError:  # the interpreter is already shutting down: nothing will wait for the bus
        pass


def _export_storage_conf(spark: SparkSession) -> None:
    """Hand the session's object store settings (``spark.hadoop.fs.s3a.*``, ...) to regional's own reads and
    writes: this process's environment, and ``SparkContext.environment``, which Spark passes to every Python
    worker it starts (the data source's planner on the driver, the tasks on the executors). They stay in
    those processes' memory (see ``regional.storage.config``)."""
    from regional.storage.config import STORAGE_CONF_ENV, hadoop_storage_conf

    items = list(spark.sparkContext.getConf().getAll()) + list(spark.conf.getAll.items())  # the session's win
    conf = hadoop_storage_conf(items)
    if not conf:
        return
    value = json.dumps(conf, sort_keys=True)
    os.environ[STORAGE_CONF_ENV] = value
    spark.sparkContext.environment[STORAGE_CONF_ENV] = value


def is_connect(spark: SparkSession | StreamingQuery) -> bool:
    """Whether ``spark`` (a session, or a query) is Spark Connect's client side (no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _detach(spark: SparkSession) -> None:
    """At interpreter exit (classic sessions): a script that ends without ``spark.stop()`` leaves its queries
    running while Python's py4j callback server goes away, and every later listener callback from the JVM would fail
    with a stack trace. Stop listening, stop this session's queries, and let Spark's listener bus deliver
    what it already holds while Python can still answer (the bus may hand an event to a listener it is
    removing)."""
    listener = _listeners.pop(id(spark), None)
    if listener is None:
        return
    listener.closed = True
    if is_connect(spark):
        # Over Spark Connect the listener is the client's and the queries are the server's: they run on
        # without this process (until the server ends the session), as Connect's own queries do.
        if not getattr(spark, "is_stopped", False):  # a Connect session's property
            # The server already gone: pyspark warns that the listener stays, though its bus has ended with the
            # connection. Nothing is left to remove, so nothing to say at exit.
            with contextlib.suppress(Exception), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                spark.streams.removeListener(listener)  # ends the client's listener bus thread
        return
    try:
        spark.streams.removeListener(listener)
        for query in spark.streams.active:
            query.stop()
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(EXIT_DRAIN_MS)  # private[spark]: public in JVM
    except Exception:  # the session or its JVM is already gone: nothing left to detach from
        pass


def shim_state(spark: SparkSession) -> shim.ShimState | None:
    """What of the JVM shim ``register`` could load into this session."""
    return _shims.get(id(spark))


def listener_for(spark: SparkSession) -> RegionalListener | None:
    """The listener ``register`` added to this session, with its per-query metrics."""
    return _listeners.get(id(spark))


def checkpoint_of(query: StreamingQuery, timeout: float = 60.0) -> str:
    """The store location of a running regional query. A classic session asks the JVM; over Spark Connect the
    client has no JVM, and the location comes from the plan in the query's progress (the source's end offset),
    waiting up to ``timeout`` seconds for the first epoch."""
    if not is_connect(query):
        return str(query._jsq.streamingQuery().resolvedCheckpointRoot())  # internal API (Spark 4.2)
    deadline = time.monotonic() + timeout
    while True:
        store = _planned_store(query)
        if store is not None:
            return store
        if not query.isActive or time.monotonic() > deadline:
            raise RegionalConfigError(
                f"query {query.name or query.id} has reported no regional epoch, so its checkpoint is unknown to "
                "this Spark Connect client: pass checkpoint=<the writeStream checkpointLocation>")
        time.sleep(0.2)


def _planned_store(query: StreamingQuery) -> str | None:
    """The store in the last regional plan of ``query``'s progress; None before one, or for another source."""
    from regional.protocol.plan import EpochPlan

    for update in reversed(query.recentProgress):
        sources = update.sources
        if len(sources) == 1 and sources[0].endOffset:
            try:
                return EpochPlan.parse(sources[0].endOffset, "the query's progress").store
            except RegionalError:  # not a regional plan
                pass
    return None


def _stop_on_signal(query: StreamingQuery, timeout: float) -> None:
    """Ctrl-C's stop (``console``): ``stop`` for a query that has planned a regional epoch, without its warnings
    (the signal's line said what happens), and Spark's stop for any other."""
    store = _planned_store(query)
    if store is None:
        query.stop()
    else:
        stop(query, timeout, checkpoint=store, quiet=True)


def stop(query: StreamingQuery, timeout: float = 60.0, checkpoint: str | None = None, quiet: bool = False) -> bool:
    """Stop ``query`` gracefully: ask for a final global epoch, wait for it, then stop.

    Returns True when every region was current at the stop, so that the next start
    replays nothing. If that takes longer than ``timeout`` seconds, says so, stops
    anyway and returns False: the next start then reads only what was not published.
    ``quiet``: no warning when it does.
    Over Spark Connect, this process must reach the checkpoint (it writes the request there);
    ``checkpoint`` names it when the query has not reported an epoch yet.
    """
    store = Store(checkpoint or checkpoint_of(query, timeout))
    latest = store.latest_record()
    asked_after = latest.epoch if latest else -1
    store.request_final_epoch(asked_after)
    deadline = time.monotonic() + timeout
    done = False
    try:
        while query.isActive and time.monotonic() < deadline:
            latest = store.latest_record()
            idle = not query.status.get("isTriggerActive", False)
            if latest is not None and latest.whole and (latest.epoch > asked_after or idle):
                done = True
                break
            if latest is not None and _only_retries_behind(latest) and (latest.epoch > asked_after or idle):
                if quiet:
                    break
                # A record waiting to be tried again (it is dead-lettered only after records beside it passed and it
                # failed again, and after its deadLetterRetries) is not planned in the final epoch; the next start
                # tries it. Waiting out the timeout would change nothing.
                log.warning("regional: stopping with region(s) %s waiting to try an isolated record again (the "
                            "evidence rule, deadLetterRetries); the next start tries them",
                            ", ".join(sorted(r for r, s in latest.regions.items()
                                             if s.failed_alone_at is not None)[:10]))
                break
            time.sleep(0.1)
        if not done and not quiet:
            behind = sorted(r for r, s in (latest.regions.items() if latest else ()) if s.ref_epoch is not None)
            log.warning(
                "regional: no final global epoch within %.0fs (regions behind: %s); stopping anyway. "
                "The next start reads only what was not published.", timeout, ", ".join(behind[:10]) or "none",
            )
    finally:
        query.stop()
        store.clear_final_epoch_request()
    return done


def _only_retries_behind(record: EpochRecord) -> bool:
    """Every region behind waits for a retry of its isolated record, and none was cut (``EpochRecord.whole`` but
    for those)."""
    behind = [s for s in record.regions.values() if s.state is not Standing.OK]
    return (bool(behind) and all(s.failed_alone_at is not None for s in behind)
            and not any(c.cut for c in record.committed.values()))


def _check_python(spark: SparkSession) -> None:
    worker = spark.sparkContext.pythonExec
    if worker and os.path.realpath(_which(worker)) != os.path.realpath(sys.executable):
        log.warning(
            "regional: Python workers run %s but this driver runs %s; set PYSPARK_PYTHON=%s "
            "before the session starts, or workers may lack pyarrow and regional",
            worker, sys.executable, sys.executable,
        )


def _check_python_sockets(spark: SparkSession) -> None:
    """A session on loopback TCP to its Python workers (``configure`` left it so, or built without it): say
    what it costs and when the alternative works. A value the user set, either way, is their choice."""
    if spark.sparkContext.getConf().get(PYTHON_UNIX_SOCKETS) is None and not os.environ.get("PYSPARK_UDS_MODE"):
        log.warning("regional: %s is not set, so each task of a regional source or sink waits about 40 ms on "
                    "Spark's loopback TCP to its Python workers. Set it to true when the session starts if every "
                    "machine's socket directory (%s, else java.io.tmpdir) is at most %d bytes (YARN's are "
                    "longer), or to false to keep TCP; configure() sets it when the builder names a local[...] "
                    "master", PYTHON_UNIX_SOCKETS, PYTHON_SOCKET_DIR, SOCKET_DIR_ROOM)


def unix_sockets_default(options: Mapping[str, str], master: str | None = None) -> bool:
    """Whether ``configure`` turns Unix domain sockets on: only where it can see that they work, a local master
    whose socket directory is short enough, and never over the user's own choice (the key, pyspark's
    ``PYSPARK_UDS_MODE``, anything spark-submit or ``PYSPARK_SUBMIT_ARGS`` was given, spark-defaults.conf). A
    cluster's executors use their own temp directories, so there ``register`` advises."""
    if PYTHON_UNIX_SOCKETS in options or os.environ.get("PYSPARK_UDS_MODE") or not hasattr(socket, "AF_UNIX"):
        return False
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # under spark-submit: its --conf and spark-defaults.conf rule, and
        return False  # a builder's value would override them
    if PYTHON_UNIX_SOCKETS in os.environ.get("PYSPARK_SUBMIT_ARGS", "") or PYTHON_UNIX_SOCKETS in _spark_defaults():
        return False
    master = master or options.get("spark.master") or _local_remote(options) or ""
    if not (master == "local" or master.startswith("local[")):  # not local-cluster[...]: executors of their own
        return False
    directory = options.get(PYTHON_SOCKET_DIR) or _java_tmpdir(options)
    return directory is not None and len(os.fsencode(directory.rstrip("/"))) <= SOCKET_DIR_ROOM


def _local_remote(options: Mapping[str, str]) -> str | None:
    """``remote("local[2]")``: a Spark Connect server this process starts, on that master."""
    remote = options.get("spark.remote", "")
    return remote if remote.startswith("local") else None


def _spark_defaults() -> str:
    """spark-defaults.conf's text, where spark-submit would read it (empty if none)."""
    conf_dir = os.environ.get("SPARK_CONF_DIR") or os.path.join(os.environ.get("SPARK_HOME", ""), "conf")
    path = os.path.join(conf_dir, "spark-defaults.conf")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _java_tmpdir(options: Mapping[str, str]) -> str | None:
    """The driver JVM's java.io.tmpdir: the last -Djava.io.tmpdir among its options, as the JVM takes it; None
    when the options cannot be read."""
    found = "/tmp"
    for text in (os.environ.get("JAVA_TOOL_OPTIONS", ""), options.get("spark.driver.defaultJavaOptions", ""),
                 options.get("spark.driver.extraJavaOptions", ""), os.environ.get("JDK_JAVA_OPTIONS", ""),
                 os.environ.get("_JAVA_OPTIONS", "")):
        try:
            words = shlex.split(text)
        except ValueError:
            return None
        for word in words:
            if word.startswith("-Djava.io.tmpdir="):
                found = word.split("=", 1)[1]
    return found


def _which(program: str) -> str:
    if os.path.isabs(program):
        return program
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(directory, program)
        if os.path.isfile(candidate):
            return candidate
    return program


def task_max_failures(master: str, max_failures_conf: str | None) -> int:
    """Attempts Spark gives a task: ``local[N,F]`` sets F; plain ``local[N]`` gives one;
    a cluster master uses ``spark.task.maxFailures`` (default 4)."""
    match = re.fullmatch(r"local\[[^,\]]+,\s*(\d+)\]", master)
    if match:
        return int(match.group(1))
    if master.startswith("local"):
        return 1
    return int(max_failures_conf or 4)


def retries_warning(master: str, max_failures_conf: str | None, policy: Settings) -> str | None:
    """The one-line warning ``register`` gives when upstream failures cannot be quarantined."""
    attempts = task_max_failures(master, max_failures_conf)
    if not policy.enabled or attempts > policy.region_attempts:
        return None
    return (f"regional: Spark gives each task {attempts} attempt(s) ({master}) but "
            f"spark.regional.regionAttempts={policy.region_attempts}: failures upstream of the sink cannot be "
            f"isolated to their region. Use master local[N,{policy.region_attempts + 1}] or set "
            f"spark.task.maxFailures to at least {policy.region_attempts + 1}")


def _check_task_retries(spark: SparkSession, policy: Settings) -> None:
    master = spark.conf.get("spark.master", "") if is_connect(spark) else spark.sparkContext.master
    warning = retries_warning(master or "", spark.conf.get("spark.task.maxFailures", None), policy)
    if warning:
        log.warning(warning)


LOG4J2_CONFIG = Path(__file__).with_name("log4j2.properties")
JARS_CACHE = Path(os.environ.get("REGIONAL_CACHE", Path.home() / ".cache" / "regional"))


def configure(builder: SparkSession.Builder) -> SparkSession.Builder:
    """``builder`` with everything regional needs, like delta's ``configure_spark_with_delta_pip``:
    ``regional_conf`` merged into what the builder sets, and this interpreter for Python workers.

    A Spark Connect client's builder (``remote("sc://...")``) is returned as it is: the conf is the server's
    (``remote("local[...]")`` starts the server in this process, so it is configured)."""
    remote = getattr(builder, "_options", {}).get("spark.remote") or os.environ.get("SPARK_REMOTE", "")
    if remote and not remote.startswith("local"):
        log.warning("regional: configure() leaves a Spark Connect client's builder (%s) as it is: the JVM shim "
                    "and Delta go in the server's conf (start it with python -m regional.spark.connect); "
                    "register() checks that the server has them", remote.split("/;", 1)[0].split(";", 1)[0])
        return builder
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    for key, value in regional_conf(getattr(builder, "_options", {})).items():
        builder = builder.config(key, value)
    return builder


def regional_conf(given: Mapping[str, str] | None = None, master: str | None = None) -> dict[str, str]:
    """The conf regional needs in a session, or in a Spark Connect server, merged into ``given``: the JVM shim
    jar and its extension next to any others, Delta Lake (jars resolved once and cached, so sessions start
    without Ivy's resolution log), quiet logging unless ``given`` sets its own, and Unix domain sockets to the
    Python workers where ``unix_sockets_default`` says (``master``: when ``given`` has no ``spark.master``)."""
    import pyspark

    options = dict(given or {})
    shim_conf = shim.session_conf()
    with_delta = delta_fits_spark()
    if not with_delta:  # a Delta jar of another Spark line fails the session's first Delta operation, or its start
        log.warning("regional: Delta Lake's JVM (%s) is left out of the session: it is built for Spark %s.x and "
                    "pyspark is %s. target=delta and the dead-letter table still work (they write with delta-rs); "
                    "spark.read.format('delta') needs a Delta Lake built for this Spark",
                    DELTA_PACKAGE, DELTA_SPARK_LINE, pyspark.__version__)

    def joined(key: str, *values: str, sep: str = ",") -> str:
        present = [v for v in (options.get(key) or "").split(sep) if v]
        return sep.join(present + [v for v in values if v and v not in present])

    delta_extension = "io.delta.sql.DeltaSparkSessionExtension" if with_delta else ""
    out = {"spark.sql.extensions": joined("spark.sql.extensions", delta_extension,
                                          shim_conf.get("spark.sql.extensions", "")),
           "spark.jars": joined("spark.jars", shim_conf.get("spark.jars", ""), *(delta_jars() if with_delta else ()))}
    out = {key: value for key, value in out.items() if value}
    if unix_sockets_default(options, master):
        out[PYTHON_UNIX_SOCKETS] = "true"
    if with_delta and "spark.sql.catalog.spark_catalog" not in options:
        out["spark.sql.catalog.spark_catalog"] = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    if "log4j2.configurationFile" not in options.get("spark.driver.extraJavaOptions", ""):
        out["spark.driver.extraJavaOptions"] = joined(
            "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}", sep=" ")
    return out


def delta_fits_spark() -> bool:
    """Whether ``DELTA_PACKAGE`` is built for the installed pyspark's Spark line (``regional_conf`` adds it only
    then)."""
    import pyspark

    return pyspark.__version__.startswith(DELTA_SPARK_LINE + ".")


def delta_jars() -> list[str]:
    """The Delta Lake jars for ``DELTA_PACKAGE``, resolved from Maven Central once and cached, so that a
    session starts without Ivy's resolution log (about 200 lines on a first run). One process at a time
    resolves them (``machine_lock``); the others wait and read its cache."""
    from regional.machine_lock import held

    cache = JARS_CACHE / (re.sub(r"[^A-Za-z0-9_.-]", "_", DELTA_PACKAGE) + ".jars")
    jars = _cached_jars(cache)
    if jars:
        return jars
    with held(cache.with_suffix(".lock")):
        return _cached_jars(cache) or _resolve_delta_jars(cache)


def _cached_jars(cache: Path) -> list[str]:
    """The jars ``cache`` lists, if it exists and every one of them is still there; else none."""
    if not cache.exists():
        return []
    jars = cache.read_text(encoding="utf-8").split()
    return jars if jars and all(Path(j.removeprefix("file://")).exists() for j in jars) else []


def _resolve_delta_jars(cache: Path) -> list[str]:
    cache.parent.mkdir(parents=True, exist_ok=True)
    log_path = cache.with_suffix(".log")
    print(f"regional: fetching the Delta Lake jars ({DELTA_PACKAGE}) once; log in {log_path}", flush=True)
    script = ("from pyspark.sql import SparkSession\n"
              f"s = SparkSession.builder.master('local[1]').config('spark.jars.packages', {DELTA_PACKAGE!r})"
              ".config('spark.ui.enabled', 'false').getOrCreate()\n"
              "print('REGIONAL-JARS=' + s.sparkContext.getConf().get('spark.jars', ''))\ns.stop()\n")
    with open(log_path, "w", encoding="utf-8") as log_file:
        result = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=log_file, text=True)
    found = [line for line in result.stdout.splitlines() if line.startswith("REGIONAL-JARS=")]
    jars = [j for j in found[0].removeprefix("REGIONAL-JARS=").split(",") if j] if found else []
    if result.returncode != 0 or not jars:
        raise RegionalConfigError(f"could not fetch {DELTA_PACKAGE} from Maven Central (see {log_path}); check "
                                  "the network, or give the jars yourself with spark.jars")
    # Written whole, then renamed: a reader never sees half a list.
    partial = cache.with_suffix(".jars.tmp")
    partial.write_text("\n".join(jars), encoding="utf-8")
    partial.replace(cache)
    return jars


def local_spark(master: str = "local[2,3]", app_name: str = "regional",
                conf: Mapping[str, str] | None = None) -> SparkSession:
    """A local SparkSession with Delta Lake, regional's JVM shim and this interpreter for Python workers.
    The default ``local[2,3]``: three attempts per task, one more than ``regionAttempts`` (2), so that the last
    one can quarantine a region that fails upstream of the sink; two task threads, which any machine has (each
    runs a Python worker: more threads than cores only contend)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                       "spark.sql.shuffle.partitions": "4", "spark.sql.streaming.noDataMicroBatches.enabled": "false",
                       **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = configure(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def progress(query: StreamingQuery) -> Progress:
    """The figures a dashboard needs, for a running or stopped regional query (see ``Progress``): Spark 4.2
    gives Python sources and sinks no custom metrics in ``lastProgress``, so they come from the store."""
    from regional.store.status import status

    return status(checkpoint_of(query), epochs=1).progress()
