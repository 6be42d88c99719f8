from regional.protocol.settings import Settings
from regional.spark.session import retries_warning, task_max_failures


def test_task_attempts_from_the_master_and_conf():
    assert task_max_failures("local[4,3]", None) == 3
    assert task_max_failures("local[*, 5]", None) == 5
    assert task_max_failures("local[4]", "8") == 1  # local mode ignores spark.task.maxFailures
    assert task_max_failures("spark://127.0.0.1:7077", "6") == 6
    assert task_max_failures("spark://127.0.0.1:7077", None) == 4


def test_register_warns_in_one_line_when_there_is_no_room_to_quarantine():
    policy = Settings(region_attempts=2)
    warning = retries_warning("local[4]", None, policy)
    assert warning and "\n" not in warning and "local[N,3]" in warning and "maxFailures to at least 3" in warning
    assert retries_warning("local[4,2]", None, policy) is not None  # attempts 0, 1: none left to quarantine
    assert retries_warning("local[4,3]", None, policy) is None
    assert retries_warning("local[4]", None, Settings(enabled=False)) is None


def test_configure_adds_the_shim_delta_and_quiet_logging_next_to_what_the_builder_has(tmp_path, monkeypatch):
    import pyspark
    from pyspark.sql import SparkSession

    from regional.spark import session, shim

    monkeypatch.setattr(pyspark, "__version__", "4.2.1")  # the line the Delta jar is built for, on any pyspark
    jar = tmp_path / "delta.jar"
    jar.write_bytes(b"")
    monkeypatch.setattr(session, "JARS_CACHE", tmp_path)
    (tmp_path / "io.delta_delta-spark_4.2_2.13_4.4.0.jars").write_text(f"file://{jar}\n")
    monkeypatch.setattr(shim, "session_conf", lambda: {"spark.jars": "/x/regional-shim.jar",
                                                       "spark.sql.extensions": shim.EXTENSION})
    builder = SparkSession.builder.config("spark.sql.extensions", "my.Ext").config("spark.jars", "/mine.jar")
    options = session.configure(builder)._options
    assert options["spark.sql.extensions"] == f"my.Ext,io.delta.sql.DeltaSparkSessionExtension,{shim.EXTENSION}"
    assert options["spark.jars"] == f"/mine.jar,/x/regional-shim.jar,file://{jar}"
    assert f"-Dlog4j2.configurationFile={session.LOG4J2_CONFIG}" in options["spark.driver.extraJavaOptions"]
    assert session.LOG4J2_CONFIG.exists()
    again = session.configure(builder)._options  # configuring twice adds nothing twice
    assert again["spark.sql.extensions"] == options["spark.sql.extensions"] and again["spark.jars"] == options[
        "spark.jars"]
    builder._options.clear()


def test_configure_leaves_a_connect_clients_builder_as_it_is_and_says_where_the_conf_goes(caplog, monkeypatch):
    from pyspark.sql import SparkSession

    from regional.spark import session

    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    builder = SparkSession.builder.remote("sc://db.example:15002/;token=s3cret")
    try:
        options = dict(session.configure(builder)._options)
    finally:
        builder._options.clear()
    assert options == {"spark.remote": "sc://db.example:15002/;token=s3cret"}
    assert "python -m regional.spark.connect" in caplog.text and "sc://db.example:15002" in caplog.text
    assert "s3cret" not in caplog.text  # a Connect URL's parameters may carry a token


def test_on_a_spark_line_without_a_shim_or_delta_build_the_session_gets_neither_and_is_told(caplog, monkeypatch):
    import pyspark

    from regional.spark import session

    monkeypatch.setattr(pyspark, "__version__", "4.3.0")
    conf = session.regional_conf({"spark.jars": "/mine.jar"})
    assert conf.get("spark.jars") == "/mine.jar" and "spark.sql.extensions" not in conf, conf
    assert "spark.sql.catalog.spark_catalog" not in conf
    assert "JVM shim is left out" in caplog.text and "pure Python" in caplog.text
    assert "Delta Lake's JVM (io.delta:delta-spark_4.2_2.13:4.4.0) is left out" in caplog.text
    assert "still work (they write with delta-rs)" in caplog.text


def test_unix_sockets_are_turned_on_only_where_they_work_and_never_over_the_users_choice(monkeypatch):
    from regional.spark.session import unix_sockets_default

    monkeypatch.delenv("PYSPARK_UDS_MODE", raising=False)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert unix_sockets_default({"spark.master": "local[2,4]"})
    assert unix_sockets_default({}, master="local[*]")  # the Connect server's spark-submit --master
    assert not unix_sockets_default({"spark.master": "yarn"})  # executors' temp directories are their own
    assert not unix_sockets_default({"spark.master": "spark://h:7077"})
    assert not unix_sockets_default({})  # spark-submit gives the master: unknown here
    assert not unix_sockets_default({"spark.master": "local[2]", "spark.python.unix.domain.socket.enabled": "false"})
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", "/nonexistent-regional-test")
    for var in ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS"):
        monkeypatch.delenv(var, raising=False)
    assert unix_sockets_default({"spark.remote": "local[2]"})  # a Connect server this process starts
    assert not unix_sockets_default({"spark.master": "local-cluster[2,1,1024]"})
    long_dir = "/" + "d" * 61  # 62 bytes: Spark refuses it
    assert not unix_sockets_default({"spark.master": "local[2]", "spark.python.unix.domain.socket.dir": long_dir})
    assert not unix_sockets_default({"spark.master": "local[2]",
                                     "spark.driver.extraJavaOptions": f"-Xss4m -Djava.io.tmpdir={long_dir}"})
    assert unix_sockets_default({"spark.master": "local[2]", "spark.python.unix.domain.socket.dir": long_dir[:61]})
    assert not unix_sockets_default({"spark.master": "local[2]",  # counted in bytes: 31 characters, 62 bytes
                                     "spark.python.unix.domain.socket.dir": "/" + "é" * 30 + "d"})
    two_flags = f"-Djava.io.tmpdir=/tmp -Djava.io.tmpdir='{long_dir}'"  # the last is the JVM's
    assert not unix_sockets_default({"spark.master": "local[2]", "spark.driver.extraJavaOptions": two_flags})
    assert not unix_sockets_default({"spark.master": "local[2]",
                                     "spark.driver.defaultJavaOptions": f"-Djava.io.tmpdir={long_dir}"})
    assert not unix_sockets_default({"spark.master": "local[2]",  # unreadable options: the directory is unknown
                                     "spark.driver.extraJavaOptions": "-Djava.io.tmpdir='/tmp"})
    monkeypatch.setenv("_JAVA_OPTIONS", f"-Djava.io.tmpdir={long_dir}")
    assert not unix_sockets_default({"spark.master": "local[2]"})
    monkeypatch.delenv("_JAVA_OPTIONS")
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--conf spark.python.unix.domain.socket.enabled=false pyspark-shell")
    assert not unix_sockets_default({"spark.master": "local[2]"})
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS")
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "41234")  # under spark-submit: its --conf may say false
    assert not unix_sockets_default({"spark.master": "local[2]"})
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT")
    monkeypatch.setenv("PYSPARK_UDS_MODE", "false")  # pyspark's own switch
    assert not unix_sockets_default({"spark.master": "local[2]"})


def test_register_says_what_a_session_without_the_socket_setting_costs(caplog, monkeypatch):
    from types import SimpleNamespace

    from regional.spark import session

    def spark_with(conf):
        return SimpleNamespace(sparkContext=SimpleNamespace(getConf=lambda: SimpleNamespace(get=conf.get)))

    monkeypatch.delenv("PYSPARK_UDS_MODE", raising=False)
    session._check_python_sockets(spark_with({}))
    assert "spark.python.unix.domain.socket.enabled is not set" in caplog.text and "about 40 ms" in caplog.text
    caplog.clear()
    session._check_python_sockets(spark_with({"spark.python.unix.domain.socket.enabled": "false"}))
    assert caplog.text == ""  # the user chose


def test_the_connect_servers_default_master_leaves_an_attempt_to_quarantine_a_region():
    """A Spark Connect server started with regional's defaults gives each task more attempts than regionAttempts:
    under local[*] (one attempt) a poison record failed the whole query instead of quarantining its region."""
    import re

    from regional.protocol.settings import DEFAULTS
    from regional.spark.connect import server_command

    command = server_command()
    master = command[command.index("--master") + 1]
    attempts = re.fullmatch(r"local\[(?:\d+|\*),\s*(\d+)\]", master)
    assert attempts is not None, master
    assert int(attempts.group(1)) > int(DEFAULTS["regionAttempts"])
