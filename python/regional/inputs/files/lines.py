"""``source=files``: a file's records, as Spark's text source reads them (``spark.read.text``).

- **Codecs** by the file's extension in any case (``.gz``, ``.GZ``), as Spark picks them: ``.gz`` (gzip),
  ``.bz2`` (bzip2), ``.zst`` (zstd), ``.lz4`` and ``.snappy`` (Hadoop's block framing around raw LZ4 and Snappy
  blocks: what Spark writes with ``compression=lz4`` or ``snappy``, not the LZ4 frame or Snappy framing format),
  ``.deflate`` (zlib). Records and offsets count decompressed lines.
- **Line breaks** as Hadoop's ``LineReader``: ``\\n``, ``\\r\\n`` and a lone ``\\r`` each end a line (a
  ``\\r`` at the end of a read buffer followed by ``\\n`` is one break); a last line without a break is a
  record; an empty file holds none. With ``lineSep``, only that string ends a line: found from the file's start,
  each occurrence after the last one (``"||"`` splits ``"a|||"`` into ``a`` and ``|``); a file ending in it has no
  empty last record.
- A UTF-8 byte-order mark at the start of a file is dropped (elsewhere it is part of the line), as Hadoop's
  ``LineRecordReader`` does.
- ``wholetext``: a file is one record; a file of no bytes, none; a compressed file of no content, one empty
  record (as Spark: it counts the file's bytes on disk, not its content).
- Bytes that are not UTF-8 read as U+FFFD, one for each malformed sequence Java's UTF-8 decoder replaces (what
  Spark's strings show): as Python's ``errors="replace"``, except that a UTF-8-encoded surrogate (``ED A0 80``) is
  one U+FFFD, not three.

The driver counts a file's records from its bytes read in chunks, once (with its SHA-256); a task reads the
whole file and splits it with Arrow. The two must agree: ``LineFormat.count`` and ``LineFormat.records``.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import hashlib
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from regional.inputs.files.manifest import RULES, short_digest

BOM = b"\xef\xbb\xbf"
NEWLINE = ord("\n")
CARRIAGE_RETURN = ord("\r")
COUNT_SLICE = 1 << 20
# Extension -> codec, matched at the name's end in any case, as Spark's text source picks them (checked with Spark
# 4.2: ``f.GZ``, ``f.Bz2``, ``f.ZST`` and ``f.DEFLATE`` are read decompressed). Files counted with manifest rules
# 1 matched them case-sensitively, and are read so for ever.
CODECS = {".gz": "gzip", ".bz2": "bzip2", ".zst": "zstd", ".lz4": "lz4", ".snappy": "snappy", ".deflate": "deflate"}


class CorruptFile(ValueError):
    """A compressed file that does not decompress as its extension says."""


def codec_of(name: str, rules: int = RULES) -> str | None:
    end = name if rules < 2 else name.lower()
    return next((codec for ext, codec in CODECS.items() if end.endswith(ext)), None)


@dataclass(frozen=True)
class LineFormat:
    """How a file's bytes become records. ``line_sep``: None for Hadoop's default (``\\n``, ``\\r\\n``, ``\\r``)."""

    line_sep: str | None = None
    wholetext: bool = False
    legacy: bool = False  # files counted before issue 46 (manifest rules 0): ``\n`` ends a line, a ``\r`` before it
    # is dropped; nothing else (no lone ``\r``, no byte-order mark, no codec)
    rules: int = RULES  # 1: codecs' extensions in lower case only, and a lineSep at a file's end taken off before
    # splitting (``"a|||"`` with ``"||"``: ``a|``); 2: as Spark (``manifest.RULES``)

    def for_rules(self, rules: int) -> LineFormat:
        """This format as a file counted with manifest rules ``rules`` is read."""
        if rules == 0:
            return LEGACY
        return self if rules == self.rules else LineFormat(self.line_sep, self.wholetext, rules=rules)

    def describe(self) -> str:
        if self.wholetext:
            return "wholetext=true"
        return "the default line breaks" if self.line_sep is None else f"lineSep={self.line_sep!r}"

    def to_json(self) -> dict[str, Any]:
        return {"lineSep": self.line_sep, "wholetext": self.wholetext}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LineFormat:
        sep = data.get("lineSep")
        return cls(None if sep is None else str(sep), bool(data.get("wholetext", False)))

    def count(self, data: bytes) -> int:
        """The records of ``data`` (a file's decompressed content): as many as ``records`` returns."""
        if self.legacy:
            return data.count(b"\n") + (not data.endswith(b"\n")) if data else 0
        if self.wholetext:
            return 1 if data else 0
        start = 3 if data.startswith(BOM) else 0
        if len(data) <= start:
            return 0
        if self.line_sep is None:
            counter = _BreakCounter()
            counter.feed(data)
            return counter.records()
        sep = self.line_sep.encode("utf-8")
        view = data[start:] if start else data
        if self.rules < 2:
            return view.count(sep) + (not view.endswith(sep))
        return view.count(sep) + (not _ends_with_separator(view, sep))

    def records(self, data: bytes) -> pa.Array:
        """``data``'s records, as a string array."""
        if self.legacy:
            end = len(data) - 1 if data.endswith(b"\n") else len(data)
            lines = _strings(data, 0, end, "\n") if data else pa.array([], pa.string())
            return pc.replace_substring_regex(lines, r"\r$", "") if b"\r" in data else lines
        if self.wholetext:
            return _strings(data, 0, len(data), None) if data else pa.array([], pa.string())
        start = 3 if data.startswith(BOM) else 0
        if len(data) <= start:
            return pa.array([], pa.string())
        sep = self.line_sep
        if sep is None:
            sep = "\n"
            if b"\r" in data:  # Hadoop's breaks: \r\n and a lone \r are \n (files without \r: no copy)
                data = data[start:].replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                start = 0
        sep_bytes = sep.encode("utf-8")
        if self.rules < 2 or self.line_sep is None:  # (Hadoop's breaks: \n overlaps nothing, the same either way)
            end = len(data) - len(sep_bytes) if data.endswith(sep_bytes) and len(data) - len(sep_bytes) >= start \
                else len(data)
            return _strings(data, start, end, sep)
        # Split the whole file, then drop the empty piece after a separator that ends it: a separator that can
        # overlap itself ("||", "\n\n") is found from the start, so the file's last bytes need not be one
        lines = _strings(data, start, len(data), sep)
        return lines.slice(0, len(lines) - 1) if len(lines) and not lines[-1].as_py() else lines

    def fingerprint(self, name: str, chunks: Iterable[bytes]) -> tuple[int, int, str, tuple[int, str] | None]:
        """A file's size, records, short SHA-256 and (compressed files) decompressed size and SHA-256, from its
        bytes in chunks, read once: on local disk and on object storage alike."""
        codec = None if self.legacy else codec_of(name, self.rules)
        if codec is None and self.line_sep is None and not self.wholetext and not self.legacy:
            return _size_lines_digest(chunks)
        h = hashlib.sha256()
        parts = []
        for chunk in chunks:
            h.update(chunk)
            parts.append(chunk)
        raw = b"".join(parts)
        if codec is None:
            return len(raw), self.count(raw), short_digest(h), None
        data = decompress(codec, raw)
        lines = 1 if self.wholetext and raw else self.count(data)
        return len(raw), lines, short_digest(h), (len(data), short_digest(hashlib.sha256(data)))

    def decoded(self, name: str, raw: bytes) -> pa.Array:
        """In the task: the records of a file whose bytes are ``raw``."""
        codec = None if self.legacy else codec_of(name, self.rules)
        if codec is None:
            return self.records(raw)
        data = decompress(codec, raw)
        if self.wholetext and raw and not data:  # a compressed file of nothing is one empty record, as in Spark
            return pa.array([""], pa.string())
        return self.records(data)


LEGACY = LineFormat(legacy=True)


class _BreakCounter:
    """Hadoop's line breaks counted over chunks: a ``\\r`` ending one chunk and a ``\\n`` starting the next are one
    break. The chunks' first bytes are watched for a byte-order mark."""

    def __init__(self) -> None:
        self.breaks = 0
        self.size = 0
        self.head = b""
        self.last = b""

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        breaks = newlines(chunk)
        if b"\r" in chunk:  # memchr: files without \r pay one fast pass
            breaks += lone_carriage_returns(chunk)
        if self.last == b"\r" and chunk[:1] == b"\n":
            breaks -= 1  # the \r already counted ends this \n's line: \r\n across the chunks
        self.breaks += breaks
        if len(self.head) < 3:
            self.head = (self.head + chunk[:3])[:3]
        self.size += len(chunk)
        self.last = chunk[-1:]

    def records(self) -> int:
        content = self.size - (3 if self.head == BOM else 0)
        if content <= 0:
            return 0
        return self.breaks + (self.last not in (b"\n", b"\r"))


def _size_lines_digest(chunks: Iterable[bytes]) -> tuple[int, int, str, None]:
    h = hashlib.sha256()
    counter = _BreakCounter()
    for chunk in chunks:
        h.update(chunk)
        counter.feed(chunk)
    return counter.size, counter.records(), short_digest(h), None


def newlines(chunk: bytes) -> int:
    """``chunk.count(b"\\n")``, as fast, without holding the GIL (numpy's comparison releases it), so that the
    threads fingerprinting files count lines at once while hashing. By slices: the comparison's mask stays small."""
    if len(chunk) < COUNT_SLICE and isinstance(chunk, bytes):
        return chunk.count(b"\n")  # a small file: numpy's call costs more than the count
    data = np.frombuffer(chunk, np.uint8)
    return sum(int(np.count_nonzero(data[i:i + COUNT_SLICE] == NEWLINE)) for i in range(0, len(data), COUNT_SLICE))


def lone_carriage_returns(chunk: bytes) -> int:
    """The ``\\r`` of ``chunk`` not followed by ``\\n`` in it, as ``newlines`` counts: by numpy, without the GIL."""
    if len(chunk) < COUNT_SLICE and isinstance(chunk, bytes):
        return chunk.count(b"\r") - chunk.count(b"\r\n")
    data = np.frombuffer(chunk, np.uint8)
    lone = 0
    for i in range(0, len(data), COUNT_SLICE):
        part = data[i:i + COUNT_SLICE + 1]  # one byte more: a \r\n across two slices
        cr = part[:COUNT_SLICE] == CARRIAGE_RETURN
        lone += int(np.count_nonzero(cr)) - int(np.count_nonzero(cr[:len(part) - 1] & (part[1:] == NEWLINE)))
    return lone


def _ends_with_separator(data: bytes, sep: bytes) -> bool:
    """Whether the occurrences of ``sep`` found from ``data``'s start, each after the last (as ``bytes.count`` and
    ``split`` find them), include one that ends ``data``. The occurrences overlapping the last one, one another in a
    chain, are looked at from the chain's first: that one overlaps no earlier occurrence, so it is found."""
    if not data.endswith(sep):
        return False
    k = len(sep)
    first = len(data) - k
    while first > 0:
        earlier = data.rfind(sep, max(first - k + 1, 0), first - 1 + k)  # one starting in [first-k+1, first-1]
        if earlier < 0:
            break
        first = earlier
    at = first
    while at < len(data) - k:
        at = data.find(sep, at + k)
        if at < 0:
            return False
    return at == len(data) - k


def _java_replace(exc: UnicodeError) -> tuple[str, int]:
    """Java's UTF-8 decoder's replacement (Spark's strings): one U+FFFD for each malformed sequence, as Python's
    ``replace`` but for a UTF-8-encoded surrogate (``ED A0..BF``, then a continuation byte or not), which Java reads
    as one sequence (Python as two or three)."""
    assert isinstance(exc, UnicodeDecodeError)
    data, at = exc.object, exc.start
    if data[at] == 0xED and at + 1 < len(data) and 0xA0 <= data[at + 1] <= 0xBF:
        return "\ufffd", at + 3 if at + 2 < len(data) and 0x80 <= data[at + 2] <= 0xBF else at + 2
    return "\ufffd", exc.end


JAVA_REPLACE = "regional-java-replace"
codecs.register_error(JAVA_REPLACE, _java_replace)


def _strings(data: bytes, start: int, end: int, sep: str | None) -> pa.Array:
    """``data[start:end]`` split at ``sep`` (None: not split) as a string array. Bytes that are not UTF-8 become
    U+FFFD, as Java's decoder replaces them (``_java_replace``)."""
    text = _utf8_as_arrow(data, start, end)
    if text is None:  # not UTF-8: Python's decoder replaces what it cannot read. (2 GiB and more: no Arrow string
        # array holds it, and this raises ArrowCapacityError, as before; the region falls back and is retried.)
        text = pa.array([data[start:end].decode("utf-8", errors=JAVA_REPLACE)], pa.string())
    return text if sep is None else pc.list_flatten(pc.split_pattern(text, sep))


def _utf8_as_arrow(data: bytes, start: int, end: int) -> pa.Array | None:
    """``data[start:end]`` as a one-string Arrow array over the same memory; None unless it is valid UTF-8 and fits
    one string (under 2 GiB). Decoding a file into a Python string and copying that into Arrow took a task longer
    than splitting it into lines. Arrow's check refuses what Python's strict UTF-8 decoder refuses (surrogates,
    overlong forms)."""
    if end >= 2**31:
        return None
    offsets = pa.py_buffer(np.array([start, end], np.int32).tobytes())
    text = pa.StringArray.from_buffers(1, offsets, pa.py_buffer(data))
    try:
        text.validate(full=True)
    except pa.ArrowInvalid:
        return None
    return text


# -- codecs ------------------------------------------------------------------------------------------------


def decompress(codec: str, raw: bytes) -> bytes:
    """``raw`` decompressed as Hadoop's codec for ``codec`` reads it (concatenated gzip members, bzip2 and zstd
    streams included); ``CorruptFile`` if it does not decompress. An empty file holds nothing, whatever its
    extension (as Hadoop's codecs read it; zstd's decoder alone refused it)."""
    if not raw:
        return b""
    try:
        if codec == "gzip":
            return gzip.decompress(raw)
        if codec == "bzip2":
            return bz2.decompress(raw)
        if codec == "deflate":
            return _zlib_streams(raw)
        import cramjam  # zstd, and raw LZ4 and Snappy blocks: only where such files are read

        if codec == "zstd":
            return bytes(cramjam.zstd.decompress(raw))
        if codec == "lz4":
            return _hadoop_blocks(raw, _lz4_block)
        if codec == "snappy":
            return _hadoop_blocks(raw, lambda chunk, _bound: bytes(cramjam.snappy.decompress_raw(chunk)))
    except CorruptFile:
        raise
    except Exception as exc:  # each library raises its own kind (OSError, EOFError, zlib.error, cramjam's)
        raise CorruptFile(f"not valid {codec} data ({type(exc).__name__}: {exc})") from None
    raise CorruptFile(f"no codec {codec!r}")


def _zlib_streams(raw: bytes) -> bytes:
    out, rest = [], raw
    while rest:
        d = zlib.decompressobj()
        out.append(d.decompress(rest))
        if not d.eof:
            raise CorruptFile("not valid deflate data (truncated)")
        rest = d.unused_data
    return b"".join(out)


def _lz4_block(chunk: bytes, bound: int) -> bytes:
    import cramjam

    out = bytearray(bound)
    n = cramjam.lz4.decompress_block_into(chunk, out)
    return bytes(out[:n])


def _hadoop_blocks(raw: bytes, block: object) -> bytes:
    """Hadoop's ``BlockCompressorStream`` framing (``Lz4Codec``, ``SnappyCodec``): blocks of a 4-byte big-endian
    decompressed length, then compressed chunks (a 4-byte big-endian length and the chunk) until that many bytes
    came out."""
    assert callable(block)
    out, at = [], 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise CorruptFile("truncated block header")
        left = int.from_bytes(raw[at:at + 4], "big")
        at += 4
        while left > 0:
            if at + 4 > len(raw):
                raise CorruptFile("truncated chunk header")
            size = int.from_bytes(raw[at:at + 4], "big")
            at += 4
            if size <= 0 or at + size > len(raw):
                raise CorruptFile("truncated chunk")
            piece = block(raw[at:at + size], left)
            at += size
            if not piece or len(piece) > left:
                raise CorruptFile("a chunk decompressed to more than its block holds")
            out.append(piece)
            left -= len(piece)
    return b"".join(out)
