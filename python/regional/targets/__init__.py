"""Targets: one module per target (``delta``, ``python_class``), each implementing ``base.Target``."""

from regional.targets.base import EpochReport, RegionalTarget, Target, load_target

__all__ = ["EpochReport", "RegionalTarget", "Target", "load_target"]
