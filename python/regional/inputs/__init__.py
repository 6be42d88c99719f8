"""Sources: one module per source (``files``, ``generator``), each implementing ``base.RegionInput``."""

from regional.inputs.base import RegionInput, load_input

__all__ = ["RegionInput", "load_input"]
