"""source=files reads a region's files in name order, one record per line, as Spark's text source does."""

from regional.inputs.files import FilesInput


def test_lines_end_with_newline_or_carriage_return_newline_and_offsets_count_lines(tmp_path):
    region = tmp_path / "r-ü"
    region.mkdir()
    (region / "0001.txt").write_bytes(b"a\r\nb\n\r\nc")  # CRLF, LF, an empty line, no final newline
    (region / "0002.txt").write_bytes(b"d\ne\n")
    (region / ".0003.txt").write_bytes(b"hidden: still being written\n")
    source = FilesInput({"path": str(tmp_path)})
    assert source.available(0) == {"r-ü": 6}
    batches = list(source.read("r-ü", 1, 6, source.split("r-ü", 1, 6), batch_rows=2))
    rows = [row for batch in batches for row in batch.to_pylist()]
    assert rows == [{"region": "r-ü", "offset": o, "value": v} for o, v in [(1, "b"), (2, ""), (3, "c"), (4, "d"),
                                                                           (5, "e")]]
    assert all(batch.schema == FilesInput.schema and batch.num_rows <= 2 for batch in batches)
