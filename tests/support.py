"""Shared by the unit tests: a real Python target kept in memory, and task outcomes for a plan."""

from __future__ import annotations

import os

from regional.protocol.decide import Outcome, TaskOutcome
from regional.protocol.plan import EpochPlan
from regional.targets.base import Target

QUERY = "00000000-0000-4000-8000-000000000001"


class MemoryTarget(Target):
    """A two-phase target that keeps what it published in memory and publishes an epoch at most once."""

    def __init__(self, options=None):
        self.commits: dict[int, dict] = {}
        self.aborted: list = []
        self.fail_commit = False

    def prepare(self, epoch, region, batches):
        raise AssertionError("not used here")

    def commit(self, epoch, handles, report=None):
        if self.fail_commit:
            raise RuntimeError("target down")
        self.commits.setdefault(epoch, dict(handles))

    def abort(self, epoch, handles):
        self.aborted.append((epoch, dict(handles)))

    def published(self, epoch):
        return epoch in self.commits


def tasks_for(plan: EpochPlan, failing=(), quarantined=(), cut=None, attempt=0, query_id=None):
    """One outcome per planned region: written whole, unless failing, quarantined or cut ({region: end})."""
    cut = cut or {}
    out = []
    for i, r in enumerate(plan.regions):
        qid = query_id or plan.query_id
        if r.region in failing:
            out.append(TaskOutcome(i, attempt, Outcome.FAILED, region=r.region, reason="boom"))
        elif r.region in quarantined:
            out.append(TaskOutcome(i, attempt, Outcome.QUARANTINED, qid, r.region, r.start, r.start,
                                   reason="quarantined"))
        else:
            end = cut.get(r.region, r.end)
            out.append(TaskOutcome(i, attempt, Outcome.WRITTEN, qid, r.region, r.start, end, end - r.start,
                                   r.start, end - 1, f"{r.region}@{r.start}-{end}#{attempt}"))
    return out


def write_store_file(path, kind, data):
    """A store file written straight to a local path, as the store would write it (tests damage stores with it)."""
    from regional.store import files

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(files.encode(kind, data))


def read_store_file(path, kind):
    from regional.store import files

    return files.decode(str(path), kind, path.read_bytes())


def python_traceback(line: str) -> str:
    """A Python worker's failure description, as the JVM shim records it, whose exception line is ``line``."""
    frames = '  File "udf.py", line 1, in parse\n    return parse(v)\n'
    return f"Traceback (most recent call last):\n{frames}{line.strip()}\n"


def attempt_moments(now: float, task: int, cores: int, attempts: int, task_s: float) -> list[float]:
    """The protocol simulations' clock (tests/test_poison_*.py): when each attempt of a plan's task number ``task``
    begins, the epoch starting at ``now``. Tasks run on ``cores`` slots, each its ``attempts`` attempts of ``task_s``
    one after another; the slots start 0.13 s apart, so that windows cut between attempts and between tasks."""
    start = now + (task // cores) * attempts * task_s + (task % cores) * 0.13
    return [start + k * task_s for k in range(attempts)]


def write_file(path, data: bytes) -> None:
    """Write ``data`` at ``path`` whole, as a producer that renames into place does (the files source never sees
    half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, path)


def files_source(inp, ck, **options):
    """A files source on ``inp`` with its store at ``ck``, its columns decided as ``.load()`` decides them."""
    from regional.inputs import files
    from regional.store import Store

    s = files.create({"path": str(inp), **options})
    s.decide_schema()
    s.use_store(Store(ck))
    return s
