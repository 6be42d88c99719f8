"""Work that builds one object per region, at up to 10,000s of regions per epoch, on the driver.

Reading an epoch record, planning and deciding each build tens of thousands of small objects (a region
state, a range, an outcome per region) that refer to nothing cyclic. CPython's cyclic collector, triggered
by the allocation count alone, then runs full collections over the whole heap in the middle of them: about
a fifth of the driver's work per epoch at 10,000 regions. Reference counting still frees everything while
the collector waits; it runs again, as usual, once the work is done.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def cyclic_gc_paused(work: Callable[P, R]) -> Callable[P, R]:
    """Run ``work`` with the cyclic garbage collector paused (and restored however ``work`` ends)."""

    @functools.wraps(work)
    def paused(*args: P.args, **kwargs: P.kwargs) -> R:
        if not gc.isenabled():  # nested, or paused by the application: leave it as it is
            return work(*args, **kwargs)
        gc.disable()
        try:
            return work(*args, **kwargs)
        finally:
            gc.enable()

    return paused
