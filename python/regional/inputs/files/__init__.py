"""``source=files``: ``path`` holds one directory per region; each region is an append-only log of text files,
read as Spark's text source (``spark.read.text``) reads them.

Columns: ``region, offset, value``, then the partition columns if any. Writers create a file under a hidden name
(starting with ``.`` or ``_``) and rename it when it is complete; a visible file never changes.

What is read
------------
- **Directories.** ``path/<region>/`` and every directory under it, at any depth: a region's files are all the
  files of its tree (``in/us/date=2026-11-26/part-0.txt`` is a file of region ``us``, named
  ``date=2026-11-26/part-0.txt``). A name starting with ``.``, or with ``_`` and holding no ``=``, or ending with
  ``._COPYING_``, hides the file or the directory and what it holds, as in Spark's listing. ``pathGlobFilter``
  selects files by their own name. A file directly under ``path`` belongs to no region: it fails the query, as
  does a ``key=value`` directory directly under ``path``.
- **Partition directories** (``key=value``) inside a region give their values as columns after ``value``, named
  and typed as Spark's partition discovery (``files.partitions``), each region's directory being the base path.
  One rule for every directory: a plain one adds no column, a ``key=value`` one adds its key; every file of
  every region must show the same keys in the same order (else the query fails naming the file). The columns
  are decided when the query is defined (``.load()``, ``decide_schema``) and recorded in the manifest: a later
  file that does not fit them, or a restart whose directories infer other columns, fails naming the directory.
  ``recursiveFileLookup=true`` reads ``key=value`` directories as plain ones (no columns), as Spark does.
- **Records.** Line breaks are ``\\n``, ``\\r\\n`` and a lone ``\\r`` (Hadoop's ``LineReader``), or ``lineSep``;
  a UTF-8 byte-order mark at a file's start is dropped; a last line without a break is a record; an empty file
  holds none; ``wholetext=true`` makes each file one record. A ``lineSep`` is found from a file's start (one that
  overlaps itself, ``"||"``, splits as Spark's). Bytes that are not UTF-8 read as U+FFFD, one per malformed
  sequence as Java's decoder gives Spark (a UTF-8-encoded surrogate is one).
- **Compressed files**, by extension in any case (``.GZ``, as Spark), as Hadoop's codecs: ``.gz``, ``.bz2``,
  ``.zst``, ``.lz4``, ``.snappy``
  (Hadoop's block framing, as Spark writes them), ``.deflate``. Offsets count decompressed lines. A compressed
  file that is a rotation of a known file (the same directory and name once the codec's extension and a
  rotation number are taken off: ``app.log.1`` and ``app.log.2.gz``, ``x.log`` and ``x.log.gz``) and holds its
  content (logrotate's ``compress`` with ``delaycompress``, or ``gzip x.log``) is that file: never read twice
  (Spark's file source would read it again as a new file). While the uncompressed file is still there, the
  compressed one is left unread; once it is gone, the compressed file takes its place and offsets. Any other
  compressed file is new input, even with the same content.

Offsets: files in arrival order
-------------------------------
A region's offsets count its records, from 0, across its files **in the order the driver first saw them**
(files first seen in the same listing: by their path under the region, a deterministic tie-break). Each region
keeps a manifest: every file it has seen, with its first offset, record count, size, inode, modification time
and SHA-256. A new file always gets the offsets after every known one, whatever its name or directory, so an
offset, once given, means the same record for ever: ``part-10`` arriving after ``part-9`` comes after it, not
before ``part-2``, a new ``date=`` directory comes after the files already known, and a processed file deleted
shifts nothing. This is what Spark's own file source does (a log of files in the order it found them).

The manifest is durable: it lives in the query's regional store (``sources/files/``: a snapshot and the changes
since, ``store.source_log``), written before ``available`` returns, so before Spark logs any plan that uses its
offsets. It records how lines were counted (``lineSep``, ``wholetext``): a restart with other values is refused,
since the offsets given would name other records. A file counted by a regional from before these rules (``\\n``
only) keeps being read as it was counted.

Tasks never read the store: the split the driver makes for a range carries each file's name, first offset,
record count and identity. A task checks the file is still that file before reading it, and that it holds the
records the driver counted.

What writers may do, and what fails
-----------------------------------
- New files, with any names, in any directories of a region, in any order: read after everything known.
- A processed file deleted (or renamed to a hidden name): harmless. It is dropped from the manifest once
  a second listing still misses it.
- A file renamed (``mv`` within the file system) to another visible name, in any directory of its region:
  recognised by its inode, size and content (SHA-256), and never read again; a task whose planned file was
  renamed reads it under its new name. A file *copied* in is a new file, even when its content equals a
  processed file's (moving a file in from another file system is a copy); a compressed copy is the exception
  above.
- A visible file that changes (size, or content at the same size, e.g. written under its final name,
  appended to, or replaced by another file of that name) fails the query naming it, across restarts too.
  A file only touched, or replaced by a byte-equal copy, is the same file. A processed file renamed *and*
  appended to fails the same way.
- A compressed file that does not decompress fails the query naming it (Spark's text source fails on it too).
- A file deleted before all its records were published fails the query, naming the file and the offsets it
  still had; a task whose planned file is gone fails naming it. Nothing is skipped silently. Put the file
  back (same name and content) to go on.
- A region directory removed fails the query at the next listing, naming the region and the offsets it had
  not published; one whose records were all published may go (it keeps its offsets, should it come back).
- ``path`` changed between restarts is refused, naming both.

Every error says what to do, and following it loses and doubles nothing: where the only way on is to read
everything again, the advice is a new checkpoint **and** a new target (the old table keeps what it has).

A region is its directory's name: a region directory renamed is refused (a new region holding files of one
whose directory went away), since the new name would read them again from its start.

Limits: a file changed in place at the same size with its inode and modification time kept (``touch -r``)
is not noticed; a new file byte-equal to a deleted one, that the file system gives the deleted one's inode
before the deleted one is dropped, counts as that file renamed. Spark reads bytes that are not UTF-8 as they
are (a Parquet string holding them); regional writes U+FFFD for them, which is what Spark shows when it reads
them back.

The package: ``manifest`` (the manifest's types), ``lines`` (records and codecs), ``partitions`` (partition
columns), ``source`` (the source on any
storage), ``local`` (a local file system); ``regional.inputs.object_files`` (an object store) sits beside it,
and ``create`` here picks one.
"""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING

from regional.errors import RegionalConfigError
from regional.inputs.files.lines import LineFormat
from regional.inputs.files.local import LocalFiles
from regional.inputs.files.manifest import SCHEMA, SCHEMA_DDL, FileSpan, batch_of
from regional.inputs.files.source import FilesInput
from regional.location import Location, parse_location
from regional.options import Option, OptionTable

if TYPE_CHECKING:
    from regional.inputs.object_files import ObjectFiles

__all__ = ["OPTIONS", "SCHEMA", "SCHEMA_DDL", "FileSpan", "FilesInput", "LocalFiles", "batch_of", "create"]

_RATE = "Limit an epoch with regional's `maxRecordsPerTrigger` or `maxRecordsPerRegion` instead."
OPTIONS = OptionTable("source=files", [
    Option("path", "required", "The directory holding one directory per region (local, or `s3a://`, `gs://`, "
                               "`abfss://`)."),
    Option("lineSep", "", "The string that ends a line, instead of `\\n`, `\\r\\n` or `\\r`, as in Spark's text "
                          "source. Fixed for the life of the checkpoint.", stock=True),
    Option("wholetext", "false", "`true`: each file is one record. Fixed for the life of the checkpoint.",
           stock=True),
    Option("encoding", "UTF-8", "Only UTF-8: Spark's text source reads every file's bytes as UTF-8 too (its "
                                "`encoding` only encodes `lineSep`); another value is refused at start. Convert "
                                "such files to UTF-8.", stock=True),
    Option("charset", "UTF-8", "`encoding` under its other name.", stock=True),
    Option("pathGlobFilter", "", "Only files whose own name matches this glob are input (Hadoop's glob syntax, as "
                                 "Spark matches it).", stock=True),
    Option("recursiveFileLookup", "false", "Files in every directory of a region are read either way. `true`: "
                                           "`key=value` directories give no columns (as in Spark with this "
                                           "option); without it, their values are partition columns.",
           stock=True),
    Option("partitionColumnTypeInference", "true", "`false`: every partition column is STRING (Spark's conf "
                                                   "`spark.sql.sources.partitionColumnTypeInference.enabled`, as an "
                                                   "option: regional does not read that conf)."),
    Option("basePath", "", "", refused="each region's directory is the base path of its partition directories "
                                       "(path/<region>/key=value/...): remove the option.", stock=True),
    Option("ignoreCorruptFiles", "false", "Only `false`: a file that cannot be read fails the query, naming it. "
                                          "`true` (skipping it, losing its records) is refused at start.",
           stock=True),
    Option("ignoreMissingFiles", "false", "Only `false`: a file deleted with records not yet read fails the query "
                                          "naming it. `true` (losing them) is refused at start.", stock=True),
    Option("maxFilesPerTrigger", "", "", refused=f"regional limits epochs by records, not files. {_RATE}",
           stock=True),
    Option("maxBytesPerTrigger", "", "", refused=f"regional limits epochs by records, not bytes. {_RATE}",
           stock=True),
    Option("latestFirst", "false", "", refused="offsets follow the order files arrive in, and an offset once given "
                                               "names the same record for ever: files are read oldest first. "
                                               "Remove the option.", stock=True),
    Option("maxFileAge", "", "", refused="every visible file is input until it is deleted: delete (or move out of "
                                         "path) the files you no longer want read, once their records are "
                                         "published.", stock=True),
    Option("maxCachedFiles", "", "", refused="a tuning of latestFirst, which regional does not take. Remove it.",
           stock=True),
    Option("discardCachedInputRatio", "", "", refused="a tuning of latestFirst, which regional does not take. "
                                                      "Remove it.", stock=True),
    Option("cleanSource", "off", "", refused="delete or archive processed files yourself: a file whose records "
                                             "are all published may be deleted or moved out of path (it is "
                                             "dropped from the manifest); one removed too early fails the query "
                                             "naming it, and nothing is lost.", stock=True),
    Option("sourceArchiveDir", "", "", refused="it goes with cleanSource, which regional does not take: move "
                                               "processed files out of path yourself.", stock=True),
    Option("fileNameOnly", "false", "", refused="regional knows a file by its identity (inode, or size and "
                                                "content), not by its name or path. Remove it.", stock=True),
    Option("modifiedBefore", "", "", refused="every visible file is input: move the files not to be read out of "
                                             "path, or select files by name with pathGlobFilter.", stock=True),
    Option("modifiedAfter", "", "", refused="every visible file is input: move the files not to be read out of "
                                            "path, or select files by name with pathGlobFilter.", stock=True),
    Option("compression", "", "", refused="a writer's option: files are decompressed by their extension (.gz, "
                                          ".bz2, .zst, .lz4, .snappy, .deflate), as Spark reads them. Remove it.",
           stock=True),
])


def _flag(options: dict[str, str], name: str) -> bool:
    value = next((v for k, v in options.items() if k.lower() == name.lower()), "false").strip().lower()
    if value not in ("true", "false"):
        raise RegionalConfigError(f"source=files: {name} must be true or false, not {value!r}")
    return value == "true"


def _get(options: dict[str, str], name: str) -> str | None:
    return next((v for k, v in options.items() if k.lower() == name.lower()), None)


def line_format(options: dict[str, str]) -> LineFormat:
    for name in ("encoding", "charset"):
        value = _get(options, name)
        if value is None:
            continue
        try:
            utf8 = codecs.lookup(value).name == "utf-8"
        except LookupError:
            utf8 = False
        if not utf8:
            raise RegionalConfigError(
                f"source=files: {name}={value!r}: only UTF-8 files are read. Spark's text source reads every "
                "file's bytes as UTF-8 too (its encoding option only encodes lineSep), so this option would not "
                "decode them there either. Convert the files to UTF-8 (e.g. iconv -f <encoding> -t UTF-8), and "
                f"remove the option")
    for name in ("ignoreCorruptFiles", "ignoreMissingFiles"):
        if _flag(options, name):
            raise RegionalConfigError(
                f"source=files: {name}=true would skip a file and lose its records without a trace. Remove it: a "
                "file that cannot be read fails the query naming it, with what to do")
    sep = _get(options, "lineSep")
    if sep is not None and sep == "":
        raise RegionalConfigError("source=files: lineSep cannot be an empty string (as in Spark): remove it for "
                                  "the default line breaks (\\n, \\r\\n, \\r)")
    return LineFormat(sep, _flag(options, "wholetext"))


def create(options: dict[str, str]) -> FilesInput:
    path = options.get("path")
    if not path:
        raise RegionalConfigError("source=files needs the input directory: add .option('path', '/data/in') (or "
                                  "an s3a:// location)")
    location = parse_location("path", path)
    fmt = line_format(options)
    glob = _get(options, "pathGlobFilter") or None
    partitions = _flag(options, "recursiveFileLookup")
    source: FilesInput = (LocalFiles(location, fmt, glob, partitions) if location.is_local
                          else _object_files(location, fmt, glob, partitions))
    source.typed_partitions = _flag(options, "partitionColumnTypeInference") if _get(
        options, "partitionColumnTypeInference") is not None else True
    return source


def _object_files(location: Location, fmt: LineFormat, glob: str | None, partitions: bool) -> ObjectFiles:
    from regional.inputs.object_files import ObjectFiles  # imports obstore: only where it is used

    return ObjectFiles(location, fmt, glob, partitions)
