"""A few trials of the reliability campaign's random kills (``python -m reliability.run`` runs 50 per target):
a query SIGKILLed at a random moment, restarted, run to the end, and checked record by record."""

from __future__ import annotations

import random

import pytest
from reliability.random_kills import run_series


@pytest.mark.parametrize("target, source", [pytest.param("delta", "kafka", marks=pytest.mark.campaign),  # 78 s idle
                                            pytest.param("python", "files", marks=pytest.mark.campaign),
                                            pytest.param("postgres", "kafka", marks=pytest.mark.campaign)])
def test_a_query_killed_at_a_random_moment_publishes_every_record_once_in_order(request, kafka, tmp_path,
                                                                                target, source):
    seed = random.randrange(1 << 30)
    postgres = request.getfixturevalue("postgres") if target == "postgres" else None
    series = run_series(target, source, trials=1 if target == "delta" else 4, seed=seed, workdir=tmp_path,
                        broker=kafka, postgres=postgres)
    for trial in series.trials:
        assert trial.report.ok, f"seed {seed}, trial {trial.number}: {trial.report.explain()}"
    assert series.final is not None and series.final.ok, f"seed {seed}: {series.final.explain()}"
    assert series.final.landed == series.final.expected > 0
