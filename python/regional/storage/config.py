"""The one place that resolves how regional reaches an object store: from the settings the user already gives
Spark (``spark.hadoop.fs.s3a.*``), else the store's default credential chain (environment, instance profile).

``regional.register(spark)`` (``spark.session``) takes the storage keys of the session's conf that regional reads
(``fs.s3a.*`` endpoint, region and credentials, also per bucket; ``fs.gs.*`` and ``fs.azure.*`` keys; see
``hadoop_storage_conf``) and hands them to every Python process of the query, on the driver and on the
executors, through ``REGIONAL_STORAGE_CONF`` in ``SparkContext.environment`` (Spark passes it to the Python
workers it starts, with the data source's code). The keys live in those processes' environments only: they
are never written to the store, the offset log, a log line or a table's history. ``python -m regional status``
and other processes without a session read the same variable, or the store's default chain.

The result is object_store's configuration (the Rust crate behind obstore and delta-rs), one mapping for both.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from regional.errors import RegionalConfigError
from regional.location import Location

STORAGE_CONF_ENV = "REGIONAL_STORAGE_CONF"
# The Hadoop keys regional reads (``_s3``, ``_gcs``, ``_azure``); on S3 also per bucket, ``fs.s3a.bucket.<b>.<key>``.
# Only these are handed on: Spark's own conf carries other ``fs.s3a.*`` defaults (``vectored.read.*``), and a
# session holding only those must not replace the settings a process was given.
S3_KEYS = ("endpoint", "connection.ssl.enabled", "path.style.access", "endpoint.region", "region", "access.key",
           "secret.key", "session.token", "aws.credentials.provider")
_S3_KEY = re.compile(r"fs\.s3a\.(?:bucket\..+\.)?(?:" + "|".join(re.escape(k) for k in S3_KEYS) + r")", re.S)
GCS_KEYFILE = "fs.gs.auth.service.account.json.keyfile"
AZURE_KEY_PREFIX = "fs.azure.account.key."
# object_store's client keys (the rest of a resolved configuration is the store's own).
CLIENT_KEYS = {"allow_http", "connect_timeout", "timeout", "proxy_url"}
SECRET_KEYS = {"access_key_id", "secret_access_key", "session_token", "account_key", "service_account_key",
               "client_secret", "sas_key"}


def hadoop_storage_conf(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The object store keys regional reads among Spark conf ``items``: ``spark.hadoop.fs.s3a.endpoint`` ->
    ``fs.s3a.endpoint``."""
    found: dict[str, str] = {}
    for key, value in items:
        bare = key[len("spark.hadoop."):] if key.startswith("spark.hadoop.") else key
        if _S3_KEY.fullmatch(bare) or bare == GCS_KEYFILE or bare.startswith(AZURE_KEY_PREFIX):
            found[bare] = str(value)
    return found


def given_conf(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Hadoop storage keys handed to this process (empty: the default credential chain)."""
    raw = (os.environ if environ is None else environ).get(STORAGE_CONF_ENV, "")
    if not raw:
        return {}
    try:
        conf = json.loads(raw)
    except ValueError:
        raise RegionalConfigError(f"{STORAGE_CONF_ENV} in the environment is not a JSON object of Hadoop storage "
                                  "settings; unset it, and let regional.register(spark) set it") from None
    if not isinstance(conf, dict):
        raise RegionalConfigError(f"{STORAGE_CONF_ENV} must be a JSON object of Hadoop storage settings")
    return {str(k): str(v) for k, v in conf.items()}


def object_store_options(location: Location, conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """object_store's configuration for ``location`` (obstore's and delta-rs's keys), from the Hadoop keys
    ``conf`` (default: ``given_conf()``). What is not given is left to the store's default chain."""
    conf = given_conf() if conf is None else conf
    if location.scheme == "s3":
        return _s3(location.container, conf)
    if location.scheme == "gs":
        return _gcs(conf)
    if location.scheme == "az":
        return _azure(location.container, conf)
    return {}


def delta_options(location: Location) -> dict[str, str] | None:
    """delta-rs's storage options for a Delta table at ``location``: ``object_store_options``, and on S3 commits
    made with a conditional put (If-None-Match, which S3 has had since 2024) instead of a lock service."""
    options = object_store_options(location)
    if location.scheme == "s3":
        options.setdefault("conditional_put", "etag")
    return options or None


def redacted(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` fit for a message: secrets replaced."""
    return {k: ("*****" if k in SECRET_KEYS else v) for k, v in options.items()}


def _s3(bucket: str, conf: Mapping[str, str]) -> dict[str, str]:
    def get(key: str) -> str | None:  # Hadoop's per-bucket settings win over the global ones
        value = conf.get(f"fs.s3a.bucket.{bucket}.{key}", conf.get(f"fs.s3a.{key}"))
        return value.strip() if value is not None and value.strip() else None

    options: dict[str, str] = {}
    endpoint = get("endpoint")
    if endpoint:
        if "://" not in endpoint:
            ssl = (get("connection.ssl.enabled") or "true").lower() != "false"
            endpoint = ("https://" if ssl else "http://") + endpoint
        options["endpoint"] = endpoint
        if endpoint.startswith("http://"):
            options["allow_http"] = "true"
    if (get("path.style.access") or "false").lower() == "true":
        options["virtual_hosted_style_request"] = "false"
    region = get("endpoint.region") or get("region")
    if region:
        options["region"] = region
    for hadoop, ours in (("access.key", "access_key_id"), ("secret.key", "secret_access_key"),
                         ("session.token", "session_token")):
        value = get(hadoop)
        if value:
            options[ours] = value
    provider = get("aws.credentials.provider") or ""
    if "Anonymous" in provider:
        options["skip_signature"] = "true"
    return options


def _gcs(conf: Mapping[str, str]) -> dict[str, str]:
    keyfile = conf.get(GCS_KEYFILE)
    return {"service_account_path": keyfile} if keyfile else {}


def _azure(container: str, conf: Mapping[str, str]) -> dict[str, str]:
    account_host = container.partition("@")[2]
    key = conf.get(f"{AZURE_KEY_PREFIX}{account_host}")
    return {"account_key": key} if key else {}


def split_client_options(options: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the store's configuration, the HTTP client's) as obstore takes them."""
    store = {k: v for k, v in options.items() if k not in CLIENT_KEYS}
    client = {k: v for k, v in options.items() if k in CLIENT_KEYS}
    return store, client
