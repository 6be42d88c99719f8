"""``spark.regional.*`` conf keys and per-query options.

A conf key ``spark.regional.X`` sets the default; ``.option("X", ...)`` on the
query overrides it. Keys are matched case-insensitively, as Spark does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from regional.errors import RegionalConfigError

CONF_PREFIX = "spark.regional."

DEFAULTS: dict[str, str] = {
    "enabled": "true",
    "maxConsecutiveFailures": "10",
    "maxFailureRatio": "0.5",
    "regionTimeout": "",
    "regionAttempts": "2",
    "retainEpochs": "100",
}


def shared_options(options: Mapping[str, str]) -> dict[str, str]:
    """The regional settings (the keys of DEFAULTS) among a query side's own options, keys lower-cased.

    The source's tasks need them, and a user may give them on writeStream: the sink shares them via the store.
    """
    keys = {k.lower() for k in DEFAULTS}
    return {k.lower(): str(v) for k, v in options.items() if k.lower() in keys}


def merge_options(conf: Mapping[str, str], options: Mapping[str, str]) -> dict[str, str]:
    """Defaults, then ``spark.regional.*`` conf, then the query's options; keys lower-cased."""
    merged = {k.lower(): v for k, v in DEFAULTS.items()}
    for key, value in conf.items():
        if key.lower().startswith(CONF_PREFIX):
            merged[key[len(CONF_PREFIX):].lower()] = value
    merged.update({k.lower(): v for k, v in options.items()})
    return merged


@dataclass(frozen=True)
class RegionalPolicy:
    """How epochs are decided; see DESIGN.md section 3, conf keys."""

    enabled: bool = True
    max_consecutive_failures: int = 10
    max_failure_ratio: float = 0.5
    region_timeout_s: float | None = None
    region_attempts: int = 2
    retain_epochs: int = 100

    @classmethod
    def from_options(cls, opts: Mapping[str, str]) -> RegionalPolicy:
        timeout = opts.get("regiontimeout", "").strip()
        return cls(
            enabled=parse_bool(opts, "enabled"),
            max_consecutive_failures=parse_int(opts, "maxConsecutiveFailures", minimum=1),
            max_failure_ratio=parse_ratio(opts, "maxFailureRatio"),
            region_timeout_s=parse_duration("regionTimeout", timeout) if timeout else None,
            region_attempts=parse_int(opts, "regionAttempts", minimum=1),
            retain_epochs=parse_int(opts, "retainEpochs", minimum=1),
        )


def policy_for_plan(policy: RegionalPolicy, regional_epochs: bool) -> RegionalPolicy:
    """A plan that mixes regions between tasks (the JVM shim's check) runs all-or-nothing epochs."""
    return policy if regional_epochs or not policy.enabled else replace(policy, enabled=False)


def _raw(opts: Mapping[str, str], key: str, default: str | None = None) -> str:
    value = opts.get(key.lower())
    if value is None:
        value = DEFAULTS.get(key, "") if default is None else default
    return str(value).strip()


def parse_bool(opts: Mapping[str, str], key: str, default: str | None = None) -> bool:
    value = _raw(opts, key, default).lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise RegionalConfigError(f"{key}={value!r} is not a boolean: use true or false")


def parse_int(opts: Mapping[str, str], key: str, minimum: int, default: str | None = None) -> int:
    value = _raw(opts, key, default)
    try:
        number = int(value)
    except ValueError:
        raise RegionalConfigError(f"{key}={value!r} is not a whole number") from None
    if number < minimum:
        raise RegionalConfigError(f"{key}={number} is too small: it must be at least {minimum}")
    return number


def parse_optional_int(opts: Mapping[str, str], key: str, minimum: int) -> int | None:
    if not str(opts.get(key.lower(), "")).strip():
        return None
    return parse_int(opts, key, minimum)


def parse_ratio(opts: Mapping[str, str], key: str) -> float:
    value = _raw(opts, key)
    try:
        ratio = float(value)
    except ValueError:
        raise RegionalConfigError(f"{key}={value!r} is not a number between 0 and 1") from None
    if not 0.0 <= ratio <= 1.0:
        raise RegionalConfigError(f"{key}={ratio} must be between 0 and 1")
    return ratio


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|milliseconds?|s|sec|seconds?|m|min|minutes?|h|hours?)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001, "s": 1.0, "sec": 1.0,
                 "second": 1.0, "seconds": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
                 "minutes": 60.0, "h": 3600.0, "hour": 3600.0, "hours": 3600.0}


def parse_duration(key: str, value: str) -> float:
    """``"30s"``, ``"500ms"``, ``"2 minutes"`` or a bare number of seconds, in seconds."""
    match = _DURATION.match(value)
    if not match:
        raise RegionalConfigError(f"{key}={value!r} is not a duration: write e.g. '30s', '500ms' or '2 minutes'")
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2) or "s"]
    if seconds <= 0:
        raise RegionalConfigError(f"{key}={value!r} must be longer than zero")
    return seconds
