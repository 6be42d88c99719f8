"""Region ids come from the outside world; they never become raw path parts.

``encode_region`` maps any valid id to a file-name-safe component that is
bounded in length, free of separators and reserved device names, and distinct
for distinct ids even on case-insensitive file systems (a hash of the raw id
is always appended).
"""

from __future__ import annotations

import hashlib
import string

from regional.errors import RegionalConfigError

MAX_REGION_ID_LENGTH = 1024
_SAFE = frozenset(string.ascii_letters + string.digits + "-_")
_SLUG_LENGTH = 40


def validate_region_id(region: object) -> str:
    """Return ``region`` if it can be a region id, else raise a clear error."""
    if not isinstance(region, str):
        raise RegionalConfigError(f"region id must be a string, got {type(region).__name__}: {region!r}")
    if region == "":
        raise RegionalConfigError("region id must not be empty: give every row a non-empty 'region'")
    if len(region) > MAX_REGION_ID_LENGTH:
        raise RegionalConfigError(
            f"region id of {len(region)} characters is longer than {MAX_REGION_ID_LENGTH}: "
            f"shorten it (it starts {region[:40]!r})"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in region):
        raise RegionalConfigError(f"region id {region!r} contains control characters: remove them")
    try:
        region.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RegionalConfigError(f"region id {region!r} is not valid Unicode text: {exc}") from None
    return region


def encode_region(region: str) -> str:
    """A safe, bounded, collision-free file-name component for ``region``."""
    validate_region_id(region)
    digest = hashlib.sha256(region.encode("utf-8")).hexdigest()[:16]
    return f"r-{_slug(region)[:_SLUG_LENGTH]}-{digest}"


def _slug(region: str) -> str:
    """Readable part of the name: safe characters kept, others percent-encoded."""
    parts: list[str] = []
    for c in region:
        if c in _SAFE:
            parts.append(c)
        else:
            parts.extend(f"%{b:02X}" for b in c.encode("utf-8"))
    return "".join(parts)
