"""Where regional's bytes live: one storage layer for every location it reads or writes (the checkpoint's
store, Spark's offset log as the sink reads it, and, as they move onto it, the files source, the Delta target
and the dead letters).

``open_storage(location)`` gives the ``Storage`` of a ``regional.location.Location``: local files
(``storage.local``) or an object store (``storage.object_store``: S3, GCS, Azure through obstore). A new
scheme is a new module here and a line in ``_BACKENDS``; nothing else changes.
"""

from __future__ import annotations

import importlib

from regional.location import Location
from regional.storage.base import FenceLost, ObjectInfo, Storage

__all__ = ["FenceLost", "ObjectInfo", "Storage", "open_storage"]

# Location.scheme -> the module whose ``open(location)`` builds its Storage.
_BACKENDS = {"file": "regional.storage.local", "s3": "regional.storage.object_store",
             "gs": "regional.storage.object_store", "az": "regional.storage.object_store"}


def open_storage(location: Location) -> Storage:
    backend = importlib.import_module(_BACKENDS[location.scheme])
    storage: Storage = backend.open(location)
    return storage
