"""What regional hands on of a session's storage settings (``regional.storage.config``)."""

from __future__ import annotations

from regional.location import parse_location
from regional.storage.config import hadoop_storage_conf, object_store_options


def test_only_the_keys_regional_reads_are_handed_on_and_sparks_own_defaults_are_not():
    """Spark's conf carries ``spark.hadoop.fs.s3a.vectored.read.*`` of its own: a session with only those must
    hand on nothing, or it would replace the settings this process was given (it did: every S3 test after the
    first ``regional.register`` in a run reached for the instance profile)."""
    spark_defaults = [("spark.hadoop.fs.s3a.vectored.read.max.merged.size", "2M"),
                      ("spark.hadoop.fs.s3a.vectored.read.min.seek.size", "128K")]
    assert hadoop_storage_conf(spark_defaults) == {}
    given = [("spark.hadoop.fs.s3a.endpoint", "http://127.0.0.1:9000"),
             ("spark.hadoop.fs.s3a.bucket.my.bucket.access.key", "k"),
             ("spark.hadoop.fs.s3a.bucket.a..b.endpoint", "http://h"),  # the location parser takes such names
             ("spark.hadoop.fs.s3a.bucket.my.bucket.vectored.read.min.seek.size", "1"),
             ("spark.hadoop.fs.azure.account.key.acct.blob.core.windows.net", "z"),
             ("spark.hadoop.fs.gs.auth.service.account.json.keyfile", "/key.json"),
             ("spark.hadoop.fs.s3a.secret.key", "s")]
    conf = hadoop_storage_conf(spark_defaults + given)
    assert conf == {"fs.s3a.endpoint": "http://127.0.0.1:9000", "fs.s3a.bucket.my.bucket.access.key": "k",
                    "fs.s3a.bucket.a..b.endpoint": "http://h",
                    "fs.azure.account.key.acct.blob.core.windows.net": "z",
                    "fs.gs.auth.service.account.json.keyfile": "/key.json", "fs.s3a.secret.key": "s"}
    options = object_store_options(parse_location("path", "s3a://my.bucket/in"), conf)
    assert options["access_key_id"] == "k" and options["secret_access_key"] == "s"


class _Asked(dict):
    """A conf that remembers every key a resolver asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[str] = set()

    def get(self, key, default=None):  # type: ignore[override]
        self.asked.add(key)
        return super().get(key, default)


def test_every_key_a_resolver_reads_is_one_that_is_handed_on():
    """The filter lists the keys by hand beside the resolvers that read them: a key read but not listed would
    never reach the executors, silently."""
    for path in ("s3a://my.bucket/in", "gs://bucket-1/in", "abfss://data@acct.dfs.core.windows.net/in"):
        conf = _Asked()
        object_store_options(parse_location("path", path), conf)
        assert conf.asked, path
        for key in conf.asked:
            assert hadoop_storage_conf([(f"spark.hadoop.{key}", "v")]) == {key: "v"}, (path, key)
