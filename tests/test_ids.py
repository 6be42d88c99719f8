import os

import pytest

from regional.errors import RegionalConfigError
from regional.ids import encode_region, validate_region_id

AWKWARD = ["../x", "a/b", "CON", "con", "NUL", "x" * 300, ".", "..", "a\\b", "ü-région", "a b", "a%2Fb", "-rf"]


@pytest.mark.parametrize("region", AWKWARD)
def test_awkward_ids_encode_to_one_safe_bounded_path_part(region, tmp_path):
    name = encode_region(region)
    assert os.sep not in name and "/" not in name and "\\" not in name
    assert name not in (".", "..") and not name.startswith(".")
    assert len(name) <= 80
    assert name.isascii()
    assert name.split(".")[0].upper() not in {"CON", "PRN", "AUX", "NUL", "COM1", "LPT1"}
    # it really is usable as one file name, inside the directory
    (tmp_path / name).write_text("x")
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_encoding_is_stable_and_distinct():
    names = [encode_region(r) for r in AWKWARD]
    assert len(set(names)) == len(AWKWARD)
    assert encode_region("Region") != encode_region("region")  # case-insensitive file systems
    assert encode_region("x" * 300) != encode_region("x" * 301)  # truncation does not collide
    assert encode_region("a/b") == encode_region("a/b")


@pytest.mark.parametrize("bad", ["", "a\nb", "tab\there", "nul\x00", "x" * 1025, 7, None])
def test_invalid_ids_are_refused_with_a_clear_error(bad):
    with pytest.raises(RegionalConfigError, match="region id"):
        validate_region_id(bad)
    with pytest.raises(RegionalConfigError):
        encode_region(bad)
