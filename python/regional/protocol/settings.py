"""The one place that resolves a query's regional settings (docs/design.md, "Settings").

Order, lowest first: built-in defaults, ``spark.regional.*`` conf, then the
query's own options on ``readStream`` and ``writeStream``. A key given on both
sides with different values is refused, naming both. Keys match
case-insensitively, as Spark's options do.

The driver resolves the settings once per query run, when it plans; the plan
carries them to every task, so tasks never re-derive them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from regional.errors import RegionalConfigError
from regional.location import optional_location_text
from regional.options import Option, OptionTable

CONF_PREFIX = "spark.regional."

DEFAULTS: dict[str, str] = {
    "enabled": "true",
    "maxConsecutiveFailures": "10",
    "maxFailureRatio": "0.5",
    "regionTimeout": "",
    "regionAttempts": "2",
    "retainEpochs": "100",
    "deadLetterPath": "",
    "deadLetterTopic": "",
    "maxDeadLettersPerEpoch": "10",
    # A record is dead-lettered after its 5th try, each a minute after the one before: poison reaches the dead letters
    # after 4 minutes of waits plus its isolation's epochs (docs/design.md, "Poison or outage"), under the shipped
    # 15-minute alert; Kafka Connect's errors.retry.delay.max.ms and Flink's exponential-delay max-backoff are a
    # minute too, and Kafka Streams gives a task 5 minutes (task.timeout.ms) before a transient error is fatal.
    "deadLetterRetries": "4",
    "deadLetterRetryBackoff": "1m",
    # The user's own verdict (docs/dead-letters.md, "Your own verdict"): exception classes that are the record's
    # fault, dead-lettered on their first failure alone, and classes that are an outage, never dead-lettered.
    "deadLetterOn": "",
    "outageOn": "",
    # Every suspect is resolved within this (issue 55): proven poison before it, or the policy decides at it. Half
    # an hour leaves the shipped retries (4 minutes of waits) and any isolation many times over, and fits within
    # the hour an on-call person looks at a paged alert.
    "suspectTimeout": "30m",
    "onSuspectTimeout": "fail",
    # Records a bisection's last step tries alone side by side, weighed as one set (issue 55): a burst of poison
    # of this many records is proven in about the time of one. Each is a Spark task that fails and is retried
    # (regionAttempts) in every epoch the set is tried; 16 such tasks cost a few seconds of an epoch on 2 cores.
    "suspectsTogether": "16",
}
MAX_SUSPECTS_TOGETHER = 1024  # tasks per region in one epoch: more would crowd out every other region
SETTING_KEYS = {k.lower(): k for k in DEFAULTS}  # lower-cased -> canonical spelling

# The settings as the docs list them; each is also a ``spark.regional.<name>`` conf default, and may be given on
# readStream or writeStream (docs/design.md, "Settings").
_MEANINGS = {
    "enabled": "`true`: regional epochs. `false`: every epoch all-or-nothing, same source, sink and data layout.",
    "maxConsecutiveFailures": "A region that fell back this many epochs in a row makes the next epoch "
                              "forced-global; if that fails, it commits nothing, the counters reset, and the query "
                              "goes on.",
    "maxFailureRatio": "When the regions that fail in one epoch are a larger share than this of the regions with "
                       "work, the epoch commits nothing.",
    "regionTimeout": "A region still working when this time is up is cut: what it finished commits, the rest moves "
                     "to the next epoch (e.g. `30s`). Empty: no limit.",
    "regionAttempts": "Task attempts after which a failure upstream of the sink quarantines the region for the "
                      "epoch; must be below `spark.task.maxFailures`.",
    "retainEpochs": "Epoch records kept, besides those a fallen-back region still references.",
    "deadLetterPath": "A Delta table for poison records, isolated to the record; empty: no isolation.",
    "deadLetterTopic": "A Kafka topic for poison records instead of a table (its producer: `deadLetter.kafka.*`).",
    "maxDeadLettersPerEpoch": "The dead-letter brake: an epoch that would dead-letter records of more regions fails "
                              "the query with a clear error (a set proven together, `suspectsTogether`, is one).",
    "deadLetterRetries": "Tries, beyond the first, in which an isolated record must fail again before it is "
                         "dead-lettered. A try is a failure of the record alone after records of its own region "
                         "beside it passed, after an earlier failure alone: an outage cannot make one, a service "
                         "that keeps going down and up must make this many more.",
    "deadLetterRetryBackoff": "The least time between two of those tries (e.g. `1m`): with the defaults, a record "
                              "keeps failing for at least 4 minutes before it is dead-lettered.",
    "deadLetterOn": "Exception classes that are the record's fault, a comma list (e.g. `ValueError, "
                    "json.JSONDecodeError`): with dead letters on, an isolated record whose every attempt alone "
                    "failed with one of them is "
                    "dead-lettered at once, without neighbours' evidence or retries. A name matches a class of that "
                    "simple name whose module path begins with the name's (subclasses are not matched); "
                    "`regional.PoisonRecord` always is one.",
    "outageOn": "Exception classes that mean an outage, a comma list (e.g. `ConnectionError, TimeoutError`): a record "
                "failing with one of them is never dead-lettered, however long it lasts; it is tried again with "
                "back-off. `regional.Outage` always is one. A class in both lists is refused.",
    "suspectTimeout": "The bound on a suspect: an isolated record that keeps failing alone without a verdict is "
                      "dead-lettered on proof within this time after its first failure alone (plus one retry, at "
                      "most 10 s), or `onSuspectTimeout` decides (e.g. `30m`). Must be at least `deadLetterRetries` "
                      "times `deadLetterRetryBackoff` plus 10 s. `outageOn` classes never reach it.",
    "onSuspectTimeout": "What happens to a suspect still unproven at `suspectTimeout`: `fail` stops the query with "
                        "an error naming the region, the offset, what was missing and what to set (restarting "
                        "resumes where it stopped); `deadLetter` dead-letters it, unless records its region already "
                        "published fail now too (an outage, or a changed query: then it waits and is tried "
                        "again).",
    "suspectsTogether": "How many records the last step of isolation tries alone side by side, each in its own "
                        "Spark task, to be proven poison as one set: the records from the suspect on that failed "
                        "alone in every epoch it did are dead-lettered with it, on its proof, and count once "
                        "towards `maxDeadLettersPerEpoch`. A burst of poison this long costs the time of one "
                        "suspect; each record tried is a task (and its retries) in every epoch the set is tried. "
                        "`1`: one record at a time.",
}
SETTINGS_OPTIONS = OptionTable("regional's settings", [Option(k, v, _MEANINGS[k]) for k, v in DEFAULTS.items()])


@dataclass(frozen=True)
class Settings:
    """How epochs run and are decided; one resolved value per key."""

    enabled: bool = True
    max_consecutive_failures: int = 10
    max_failure_ratio: float = 0.5
    region_timeout_s: float | None = None
    region_attempts: int = 2
    retain_epochs: int = 100
    dead_letter_path: str | None = None  # a Delta table for records isolated as poison; None: no isolation
    max_dead_letters_per_epoch: int = 10  # the dead-letter brake: more in one epoch fails the query
    # A Kafka topic for them instead (its producer's settings, ``deadLetter.kafka.*``, never enter the plan).
    dead_letter_topic: str | None = None
    # A record is dead-lettered only on its try number this + 1 (a try: docs/design.md, "Poison or outage"), each
    # try at least ``dead_letter_retry_backoff_s`` after the one before. Users get DEFAULTS (4 and 1m, through
    # ``resolve_settings``); 0 here, as in plans written before these settings existed.
    dead_letter_retries: int = 0
    dead_letter_retry_backoff_s: float = 0.0
    # The user's verdict (``deadLetterOn``, ``outageOn``): exception class names, as given (``verdict_of``).
    dead_letter_on: tuple[str, ...] = ()
    outage_on: tuple[str, ...] = ()
    # The bound on a suspect (``weigh_evidence``): None in plans written before it (no bound, as then).
    suspect_timeout_s: float | None = None
    dead_letter_on_timeout: bool = False  # onSuspectTimeout=deadLetter; False: fail
    # Records tried alone side by side and proven poison as one set (``plan.together``); 1 in plans written before it.
    suspects_together: int = 1

    @property
    def isolates(self) -> bool:
        """Whether poison records are isolated: a dead-letter table or topic is given."""
        return self.dead_letter_path is not None or self.dead_letter_topic is not None

    @classmethod
    def parse(cls, values: Mapping[str, str]) -> Settings:
        """From canonical or lower-cased keys to typed values; a bad value is a clear error."""
        opts = {k.lower(): str(v) for k, v in values.items()}
        timeout = opts.get("regiontimeout", "").strip()
        backoff = opts.get("deadletterretrybackoff", "").strip()
        retries = parse_int(opts, "deadLetterRetries", minimum=0)
        backoff_s = parse_backoff("deadLetterRetryBackoff", backoff) if backoff else 0.0
        suspect_timeout_s, dead_letter_on_timeout = parse_suspect_bound(opts, retries, backoff_s, backoff)
        return cls(
            enabled=parse_bool(opts, "enabled"),
            max_consecutive_failures=parse_int(opts, "maxConsecutiveFailures", minimum=1),
            max_failure_ratio=parse_ratio(opts, "maxFailureRatio"),
            region_timeout_s=parse_duration("regionTimeout", timeout) if timeout else None,
            region_attempts=parse_int(opts, "regionAttempts", minimum=1),
            retain_epochs=parse_int(opts, "retainEpochs", minimum=1),
            dead_letter_path=optional_location_text("deadLetterPath", opts.get("deadletterpath", "")),
            max_dead_letters_per_epoch=parse_int(opts, "maxDeadLettersPerEpoch", minimum=0),
            dead_letter_topic=parse_topic(opts, "deadLetterTopic", opts.get("deadletterpath", "")),
            dead_letter_retries=retries,
            dead_letter_retry_backoff_s=backoff_s,
            suspect_timeout_s=suspect_timeout_s,
            dead_letter_on_timeout=dead_letter_on_timeout,
            suspects_together=parse_int(opts, "suspectsTogether", minimum=1, maximum=MAX_SUSPECTS_TOGETHER),
            **parse_verdicts(opts),
        )

    def all_or_nothing(self) -> Settings:
        return replace(self, enabled=False)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Settings:
        # absent in plans written before them
        optional = {"dead_letter_path", "max_dead_letters_per_epoch", "dead_letter_topic", "dead_letter_retries",
                    "dead_letter_retry_backoff_s", "dead_letter_on", "outage_on", "suspect_timeout_s",
                    "dead_letter_on_timeout", "suspects_together"}
        names = {f.name for f in fields(cls)} - optional
        missing = names - set(data)
        if missing:
            raise ValueError(f"settings lack {sorted(missing)}")
        timeout = data["region_timeout_s"]
        dead_letters = data.get("dead_letter_path")  # absent in plans written before dead letters existed
        return cls(bool(data["enabled"]), int(data["max_consecutive_failures"]), float(data["max_failure_ratio"]),
                   None if timeout is None else float(timeout), int(data["region_attempts"]),
                   int(data["retain_epochs"]), None if dead_letters is None else str(dead_letters),
                   int(data.get("max_dead_letters_per_epoch", cls.max_dead_letters_per_epoch)),
                   None if data.get("dead_letter_topic") is None else str(data["dead_letter_topic"]),
                   int(data.get("dead_letter_retries", 0)), float(data.get("dead_letter_retry_backoff_s", 0.0)),
                   tuple(str(n) for n in data.get("dead_letter_on") or ()),
                   tuple(str(n) for n in data.get("outage_on") or ()),
                   None if data.get("suspect_timeout_s") is None else float(data["suspect_timeout_s"]),
                   bool(data.get("dead_letter_on_timeout", False)), int(data.get("suspects_together", 1)))


def given_settings(options: Mapping[str, str]) -> dict[str, str]:
    """The regional setting keys among one side's options, canonical spelling."""
    return {SETTING_KEYS[k.lower()]: str(v) for k, v in options.items() if k.lower() in SETTING_KEYS}


def conf_settings(conf: Mapping[str, str]) -> dict[str, str]:
    """``spark.regional.X`` conf entries as setting keys (other ``spark.regional.*`` keys pass through)."""
    out = {}
    for key, value in conf.items():
        if key.lower().startswith(CONF_PREFIX):
            name = key[len(CONF_PREFIX):]
            out[SETTING_KEYS.get(name.lower(), name)] = str(value)
    return out


def resolve_settings(conf: Mapping[str, str], read_options: Mapping[str, str],
                     write_options: Mapping[str, str]) -> Settings:
    """Defaults, then conf, then both sides' options; the same key with two values is refused."""
    read, write = given_settings(read_options), given_settings(write_options)
    conflicts = sorted(k for k in set(read) & set(write) if read[k].strip() != write[k].strip())
    if conflicts:
        k = conflicts[0]
        raise RegionalConfigError(
            f"{k} is given twice with different values: readStream .option('{k}', '{read[k]}') and writeStream "
            f".option('{k}', '{write[k]}'). Give it once (either side), or the same value on both"
        )
    values = {**DEFAULTS, **{k: v for k, v in conf_settings(conf).items() if k in DEFAULTS}, **read, **write}
    return Settings.parse(values)


def parse_bool(opts: Mapping[str, str], key: str, default: str | None = None) -> bool:
    value = _raw(opts, key, default).lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise RegionalConfigError(f"{key}={value!r} is not a boolean: use true or false")


def parse_int(opts: Mapping[str, str], key: str, minimum: int, default: str | None = None,
              maximum: int | None = None) -> int:
    value = _raw(opts, key, default)
    try:
        number = int(value)
    except ValueError:
        raise RegionalConfigError(f"{key}={value!r} is not a whole number") from None
    if number < minimum:
        raise RegionalConfigError(f"{key}={number} is too small: it must be at least {minimum}")
    if maximum is not None and number > maximum:
        raise RegionalConfigError(f"{key}={number} is too large: it must be at most {maximum}")
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


_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")  # Kafka's legal topic names


def parse_topic(opts: Mapping[str, str], key: str, path: str) -> str | None:
    """``deadLetterTopic``: a Kafka topic name, or None; given with ``deadLetterPath`` it is refused (dead letters
    go to one place, so that each lands there exactly once)."""
    topic = str(opts.get(key.lower(), "")).strip()
    if not topic:
        return None
    if path.strip():
        raise RegionalConfigError(f"{key}={topic!r} and deadLetterPath={path.strip()!r} are both given: dead "
                                  "letters go to one place, a Delta table (deadLetterPath) or a Kafka topic "
                                  "(deadLetterTopic). Give one (.option('deadLetterPath', '') drops a conf default)")
    if not _TOPIC.match(topic) or topic in (".", ".."):
        raise RegionalConfigError(f"{key}={topic!r} is not a Kafka topic name: use 1 to 249 letters, digits, '.', "
                                  "'_' or '-'")
    return topic


# -- The user's verdict: exception class names ----------------------------------------------------------------------

# Always named, whatever the options: a UDF raises regional.PoisonRecord to say "this record's fault" and
# regional.Outage to say "an outage" (regional.errors); a target raises RowsInvalid for rows it refuses for their own
# sake (regional.targets.base). Matched by the same rule as a user's names.
ALWAYS_POISON = ("regional.errors.PoisonRecord", "regional.targets.base.RowsInvalid")
ALWAYS_OUTAGE = ("regional.errors.Outage",)


# Classes every failure is (or is wrapped in): named in deadLetterOn, they would dead-letter any record failing alone.
TOO_BROAD = frozenset({"Exception", "BaseException", "Throwable", "Py4JJavaError", "PythonException",
                       "SparkException"})


def class_names(key: str, text: str) -> tuple[str, ...]:
    """A comma list of exception class names (``ValueError, json.JSONDecodeError``), each a dotted name; a name
    that is none is refused. ``builtins.X`` is ``X`` (Python prints built-in classes without their module)."""
    names: list[str] = []
    for raw in text.split(","):
        name = raw.strip()
        if not name:
            continue
        if not is_class_name(name):
            raise RegionalConfigError(
                f"{key}: {name!r} is not an exception class name: give dotted names separated by commas, e.g. "
                "'ValueError, json.JSONDecodeError, mymodule.BadRecord'")
        name = name.removeprefix("builtins.")
        if name not in names:
            names.append(name)
    return tuple(names)


def is_class_name(name: str) -> bool:
    """A dotted name of identifiers (``$`` allowed, as in a JVM nested class's name)."""
    parts = name.split(".")
    return all(p.replace("$", "_").isidentifier() for p in parts)


def names_overlap(a: str, b: str) -> bool:
    """Whether one class could match both names: the same simple name, and one's module path a prefix of the
    other's (``JSONDecodeError`` and ``json.decoder.JSONDecodeError`` do; ``a.E`` and ``b.E`` do not)."""
    *pa, sa = a.split(".")
    *pb, sb = b.split(".")
    shorter, longer = sorted((pa, pb), key=len)
    return sa == sb and longer[:len(shorter)] == shorter


def parse_verdicts(opts: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """``deadLetterOn`` and ``outageOn``; a class both could name is refused, naming it."""
    poison = class_names("deadLetterOn", str(opts.get("deadletteron", "")))
    outage = class_names("outageOn", str(opts.get("outageon", "")))
    for name in poison:
        if name.rsplit(".", 1)[-1] in TOO_BROAD:
            raise RegionalConfigError(
                f"deadLetterOn={name!r} names every failure (a lost connection or a bug as well as a bad record): "
                "every record that fails alone would be dead-lettered. Name the classes your code raises for bad "
                "input (e.g. 'ValueError, json.JSONDecodeError'), or raise regional.PoisonRecord for them")
    for p in (*poison, *ALWAYS_POISON):
        for o in (*outage, *ALWAYS_OUTAGE):
            if names_overlap(p, o):
                fixed = p in ALWAYS_POISON or o in ALWAYS_OUTAGE
                raise RegionalConfigError(
                    f"{_named(p, 'deadLetterOn')} and {_named(o, 'outageOn')} can name the same exception class: a "
                    "class is either the record's fault or an outage, not both. "
                    + ("regional's own classes cannot change sides; remove it from the option"
                       if fixed else "Remove it from one of the two options"))
    return {"dead_letter_on": poison, "outage_on": outage}


def _named(name: str, key: str) -> str:
    if name in ALWAYS_POISON:
        return f"{name} (always the record's fault)"
    if name in ALWAYS_OUTAGE:
        return f"{name} (always an outage)"
    return f"{name!r} ({key})"


def _raw(opts: Mapping[str, str], key: str, default: str | None = None) -> str:
    value = opts.get(key.lower())
    if value is None:
        value = DEFAULTS.get(key, "") if default is None else default
    return str(value).strip()


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|milliseconds?|s|sec|seconds?|m|min|minutes?|h|hours?)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001, "s": 1.0, "sec": 1.0,
                 "second": 1.0, "seconds": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
                 "minutes": 60.0, "h": 3600.0, "hour": 3600.0, "hours": 3600.0}


MAX_BACKOFF_S = 30 * 24 * 3600.0  # a month: longer is a typo, and past year 9999 no time can be written


def parse_backoff(key: str, value: str) -> float:
    """A duration that may be zero (no wait): ``"0"``, ``"30s"``, ``"5 minutes"``; at most ``MAX_BACKOFF_S``."""
    match = _DURATION.match(value)
    if match and float(match.group(1)) == 0:
        return 0.0
    seconds = parse_duration(key, value)
    if seconds > MAX_BACKOFF_S:
        raise RegionalConfigError(f"{key}={value!r} is longer than 30 days: give a shorter wait")
    return seconds


def parse_duration(key: str, value: str) -> float:
    """``"30s"``, ``"500ms"``, ``"2 minutes"`` or a bare number of seconds, in seconds."""
    match = _DURATION.match(value)
    if not match:
        raise RegionalConfigError(f"{key}={value!r} is not a duration: write e.g. '30s', '500ms' or '2 minutes'")
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2) or "s"]
    if seconds <= 0:
        raise RegionalConfigError(f"{key}={value!r} must be longer than zero")
    return seconds


SUSPECT_MARGIN_S = 10.0  # the least time a suspectTimeout leaves beyond the retries' waits


def parse_suspect_bound(opts: Mapping[str, str], retries: int, backoff: float, backoff_raw: str
                        ) -> tuple[float, bool]:
    """``suspectTimeout`` and ``onSuspectTimeout``, given the parsed ``deadLetterRetries`` and
    ``deadLetterRetryBackoff``. The bound must leave room for the tries it bounds: a bound the retries cannot fit in
    would decide every suspect by policy, never by proof."""
    raw = _raw(opts, "suspectTimeout")
    timeout = parse_duration("suspectTimeout", raw)
    if timeout < retries * backoff + SUSPECT_MARGIN_S:
        raise RegionalConfigError(
            f"suspectTimeout={raw} leaves no room for deadLetterRetries={retries} tries deadLetterRetryBackoff="
            f"{backoff_raw or '0'} apart: give at least {_minutes(retries * backoff + SUSPECT_MARGIN_S)} (their "
            f"waits plus {SUSPECT_MARGIN_S:g} s for the epochs that gather evidence), or fewer retries")
    policy = _raw(opts, "onSuspectTimeout").lower()
    if policy not in ("fail", "deadletter"):
        raise RegionalConfigError(f"onSuspectTimeout={policy!r} is not a policy: use fail (the query stops, "
                                  "naming the record) or deadLetter (the record is dead-lettered)")
    return timeout, policy == "deadletter"


def _minutes(seconds: float) -> str:
    return f"{seconds:g}s" if seconds < 60 or seconds % 60 else f"{seconds / 60:g}m"
