"""The interface every source implements (docs/design.md, "One epoch" and "Where the code is"), and how one is found.

An input answers two questions. On the driver: where each region's log ends now (``available``),
and what a task needs to read a range (``split``, picklable). In the task: the records of one range
(``read``), as Arrow record batches whose first two columns are ``region`` and ``offset``, in
offset order, stopping exactly at ``end``.

An input whose log can lose its oldest records (Kafka's retention) is a ``RetainedInput``: it also
says where each region's log begins now (``log_starts``), where the regions present when a new
query starts begin (``starting_offsets``) and whether losing records fails the query
(``fail_on_data_loss``). Other inputs start every region at 0 and never lose records.

An input that acts on what was published (Kafka's commitOffsetsToGroup; the dead-letter source marks the
records it replayed) is an ``AcknowledgingInput``: it hears each recorded epoch (``on_recorded``).

An input whose offsets mean something only together with state it keeps (the files source: which file
holds which offsets) is also a ``StoredInput``: the reader hands it the query's store once, on the driver, and
it keeps that state there, written before ``available`` returns the offsets that depend on it.

Built-in inputs are modules of this package named by ``source=<name>``, each exposing
``create(options) -> RegionInput``. Adding a source is adding a module: nothing else changes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import pyarrow as pa

from regional.errors import RegionalConfigError
from regional.plugins import find_plugin
from regional.store.model import EpochRecord

if TYPE_CHECKING:
    from regional.store import Store

BATCH_ROWS = 10_000
# A batch's bytes, for inputs whose records vary in size (Kafka's up to the broker's message size): 10,000 records
# of 1 MB would be one 10 GB batch, and a column past 2 GiB cannot be one Arrow array at all.
BATCH_BYTES = 64 << 20


Split = TypeVar("Split")  # what a task needs to read one range, made on the driver (picklable)


class RegionInput(ABC, Generic[Split]):
    """A source of regions. ``available``, ``ends`` and ``split`` run on the driver (the source's planning
    process); ``read`` runs in the task of one region, on an instance pickled from the driver."""

    schema: pa.Schema  # region STRING, offset BIGINT, then the source's own columns
    schema_ddl: str  # the same, as Spark DDL
    # Offsets far apart, a range of them holding few records or none (the dead-letter source keeps the original
    # records' offsets): a record isolated as poison is then probed with every record of its region before and
    # after it (``protocol.plan.probe_ranges``), not the few offsets beside it, so that its probes find records.
    sparse: bool = False

    def decide_schema(self) -> str:
        """At ``.load()``: the query's columns, as Spark DDL. Default ``schema_ddl``; an input whose columns depend on
        what it holds (the files source's partition directories) decides them here."""
        return self.schema_ddl

    def use_schema(self, fields: list[tuple[str, str]]) -> None:
        """On the driver, before ``available``: the columns Spark fixed for the query (``.load()``'s, or the
        user's ``.schema(...)``), as (name, Spark's simple type name). Default: nothing."""
        return None

    def ends(self) -> dict[str, int] | None:
        """A bounded input's final end offset per region; None (the default) when it may grow for ever."""
        return None

    @abstractmethod
    def available(self, epoch: int) -> dict[str, int]:
        """Each region's end offset (the next offset it will have), as seen when planning ``epoch``."""

    @abstractmethod
    def split(self, region: str, start: int, end: int) -> Split:
        """On the driver: what a task needs to read ``[start, end)`` of ``region`` (picklable)."""

    @abstractmethod
    def read(self, region: str, start: int, end: int, split: Split,
             batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
        """In the task: the records ``[start, end)`` of ``region``, in offset order."""

    def table_location(self) -> str | None:
        """Where the input's records live, when a query could write there too (a table's location, or a topic as
        ``kafka:<topic>``): a query's dead letters must never go into its own input. Default: None."""
        return None


class RetainedInput(ABC):
    """An ability, mixed into a ``RegionInput`` whose log loses old records (Kafka's retention); checked with
    ``isinstance``. Its methods run on the driver."""

    fail_on_data_loss: bool  # a region whose next offset was deleted (or whose log vanished) fails the query

    @abstractmethod
    def log_starts(self) -> dict[str, int]:
        """Each region's first offset still in its log, as of the last ``available``."""

    @abstractmethod
    def starting_offsets(self, available: Mapping[str, int]) -> dict[str, int]:
        """Where each region of ``available`` starts when the query is new (later regions start at their log start)."""

    def replaced(self) -> set[str]:
        """Regions whose log was replaced since their committed offset was read (a Kafka topic deleted and created
        again: its topic id changed), as of the last ``available``: their offsets name other records now, so they
        go on from their log start. An input that fails on data loss raises instead. Default: none."""
        return set()

    def selects(self, region: str) -> bool:
        """Whether the query's options still select ``region`` (a region of a topic no longer subscribed is not
        read any more: a change between restarts, not data loss). Default: every region."""
        return True


class AcknowledgingInput(ABC):
    """An ability, mixed into a ``RegionInput`` that acts on what each epoch published; checked with
    ``isinstance``. Driver side.

    ``on_recorded`` is called at least once per recorded epoch, in epoch order, and always before the next
    epoch is planned (a restarted driver hears its newest record again first); raising fails the query.
    What it does must be idempotent."""

    @abstractmethod
    def on_recorded(self, record: EpochRecord) -> None:
        """After ``record`` is recorded: e.g. commit the committed offsets to a consumer group."""

    def phase_two_options(self) -> dict[str, str] | None:
        """Options that build this input again in the sink's phase two, which then calls ``on_recorded`` right
        after the record, before Spark ends the epoch (so a query that ends after its last epoch, as
        Trigger.AvailableNow does, has heard of it). They go into the plan, Spark's offset log: nothing secret.
        Default None: heard of from the reader only."""
        return None


class StoredInput(ABC):
    """An ability, mixed into a ``RegionInput`` that keeps durable state of its own in the query's regional
    store; checked with ``isinstance``. Driver side only: tasks never see the store (what they need goes into
    ``split``), so the input must not pickle the store's state into tasks.

    Whatever offsets ``available`` returns must be durable when it returns: Spark logs the plan made from
    them, and a restart re-runs that plan with the state as stored."""

    @abstractmethod
    def use_store(self, store: Store) -> None:
        """Called once by the reader, on the driver, before ``available`` or ``split``; no I/O expected here."""

    def before_splits(self, epoch: int) -> None:
        """On the driver, when the tasks of ``epoch``'s logged plan are made (``split`` follows), at every run of
        that plan (a restart re-runs it): keep durably what its reads must see. Default: nothing."""


def load_input(options: Mapping[str, str]) -> RegionInput[Any]:
    """Build the input named by the source's ``source`` option."""
    name = options.get("source") or ""
    module = find_plugin("regional.inputs", name.lower())  # Spark's format names ignore case too
    if module is None:
        raise RegionalConfigError(
            f"unknown source {name!r}: add .option('source', 'files'), 'kafka', 'deadLetters' or 'generator' to "
            "readStream"
        )
    return module.create(dict(options))
