"""Store fuzzing: every kind of store file truncated, bit-flipped, emptied, replaced by a future format version
or deleted, at many random positions. Each case is a clear error naming the file (and publishes nothing), or
gives exactly what the undamaged store gives, or (deleted files only) a documented safe default. After the
file is restored, the epoch publishes exactly as it would have.
"""

from __future__ import annotations

import copy
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from regional.errors import RegionalStoreError
from regional.store import Store
from support import write_store_file
from test_store import a_running_store, rerun_epoch_1

POSITIONS = 24  # random positions per kind, for truncation and for bit flips
ERROR = object()  # a deleted file that must be an error


def _prepared(root: Path):
    store, target = a_running_store(root)
    store.record_latest_offsets(1, {"a": 9, "b": 9}, {"a": 0, "b": 0})
    write_store_file(store.root / "starting-offsets.json", "starting-offsets", {"a": 0, "b": 0})
    write_store_file(store.root / "query-plan.json", "query-plan", {"regional_epochs": True, "operator": None,
                                                               "reason": None})
    write_store_file(store.root / "failures" / "1" / "0-0.json", "failure", {
        "partition": 0, "attempt": 0, "executor": "driver", "exception_class": "ValueError", "message": "x"})
    return store, target


# kind -> (file, what reads it, what its deletion must give)
KINDS: dict[str, tuple[str, Callable[[Store, Any], Any], Any]] = {
    "query": ("query.json", lambda s, t: s.open_query(), ERROR),  # epochs exist: damaged, not a new query
    "epoch": ("epochs/000000000000.json", lambda s, t: rerun_epoch_1(s, t), None),  # the intent decides epoch 1
    "intent": ("intents/000000000001.json", lambda s, t: rerun_epoch_1(s, t), None),  # re-decided: nothing published
    "write-options": ("write-options.json", lambda s, t: s.read_write_options(), None),  # the source refuses to plan
    "latest-offsets": ("latest-offsets.json", lambda s, t: (s.read_latest_offsets(), s.read_log_starts()),
                       ({}, None)),  # lag unknown in status
    "starting-offsets": ("starting-offsets.json", lambda s, t: s.starting_offsets(lambda: {"a": 7}), ERROR),
    "final-epoch-request": ("final-epoch-request.json", lambda s, t: s.final_epoch_requested_since(0),
                            False),  # no graceful stop
    "referenced-epochs": ("referenced-epochs", lambda s, t: s.referenced_epochs(), []),
    "query-plan": ("query-plan.json", lambda s, t: s.plan_allows_regional_epochs(), True),  # as without the shim
    "failure": ("failures/1/0-0.json", lambda s, t: s.read_failures(1), {}),  # reasons unknown
}


def _damages(data: bytes, rng: random.Random) -> list[tuple[str, bytes | None]]:
    out: list[tuple[str, bytes | None]] = [("emptied", b""), ("deleted", None)]
    header, rest = data.split(b"\n", 1)
    out.append(("future version", re.sub(rb" v\d+ ", b" v9 ", header) + b"\n" + rest))
    for _ in range(POSITIONS):
        cut = rng.randrange(len(data) - 1)  # dropping only the final newline changes nothing
        out.append((f"truncated at {cut}", data[:cut]))
        at, bit = rng.randrange(len(data)), 1 << rng.randrange(8)
        flipped = bytearray(data)
        flipped[at] ^= bit
        out.append((f"bit {bit} flipped at {at}", bytes(flipped)))
    return out


def _outcome(use: Callable[[Store, Any], Any], store: Store, target: Any) -> tuple[str, Any]:
    try:
        return "value", use(store, target)
    except RegionalStoreError as exc:
        return "error", str(exc)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_damage_at_random_positions_is_an_error_naming_the_file_or_changes_nothing(tmp_path, kind):
    relative, use, if_deleted = KINDS[kind]
    template, template_target = _prepared(tmp_path / "template")
    path = template.root / relative
    original = path.read_bytes()
    base_store = Store(_copy(template, tmp_path / "baseline"))
    base_target = copy.deepcopy(template_target)
    baseline = _outcome(use, base_store, base_target)
    assert baseline[0] == "value", baseline

    rng = random.Random(kind)
    for i, (damage, data) in enumerate(_damages(original, rng)):
        store = Store(_copy(template, tmp_path / f"case{i}"))
        target = copy.deepcopy(template_target)
        damaged = store.root / relative
        if data is None:
            damaged.unlink()
        else:
            damaged.write_bytes(data)
        result = _outcome(use, store, target)
        where = f"{kind} {damage}: {result}"
        if result[0] == "error":
            assert str(damaged) in result[1] or str(store.root) in result[1], where
            assert target.commits == template_target.commits, f"{where}: published despite the error"
            # repaired: the file restored, the same call gives what the undamaged store gives
            damaged.parent.mkdir(parents=True, exist_ok=True)
            damaged.write_bytes(original)
            result = _outcome(use, store, target)
            assert result == baseline and target.commits == base_target.commits, f"{where}: after repair {result}"
        elif data is None and if_deleted is not ERROR and result[1] != baseline[1]:
            assert result[1] == if_deleted, where
            assert target.commits in (template_target.commits, base_target.commits), where
        else:
            assert data is not None or if_deleted is not ERROR, f"{where}: a deleted {kind} file must be an error"
            assert result == baseline and target.commits == base_target.commits, where


def _copy(store: Store, to: Path) -> Path:
    shutil.copytree(store.checkpoint.local_path(), to)
    return to
