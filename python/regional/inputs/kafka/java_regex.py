"""``subscribePattern`` is a Java regular expression in Spark (``java.util.regex.Pattern``, found anywhere in a
topic's name: Scala's ``findFirstIn``). :func:`compile_java` translates one into Python's ``re`` where Python has
the same construct under another spelling, and refuses by name, at start, what Python would read differently.

Kafka topic names hold only ASCII letters, digits, ``.``, ``_`` and ``-``; the pattern is compiled with
``re.ASCII``, so ``\\d``, ``\\w``, ``\\s``, ``\\b`` and case-insensitive matching are ASCII as Java's are by default.

Translated: ``\\Q...\\E`` (quoted text), ``\\z`` and Java's ``\\Z`` (end of input; before a final line terminator
for ``\\Z``), ``(?<name>...)`` and ``\\k<name>``, ``\\e``, ``\\cX``, ``\\0ooo`` and ``\\x{h...}``. The same in both
and passed on: classes, quantifiers (possessive ones and atomic groups on Python 3.11 and later), groups, look-around,
``(?i)`` / ``(?m)`` / ``(?s)`` at the start and scoped flag groups ``(?i:...)``.
Refused: class intersection ``&&`` and nested classes, ``\\p{...}`` / ``\\P{...}``, ``\\h \\H \\v \\V \\R \\X \\G``,
``\\b{g}``, flags ``d``, ``u``, ``U`` and ``x``, flags set in the middle of a pattern, and what Java itself refuses
though Python would take it (``(?P...)``, ``(?#...)``, ``(?(...)...)``, a ``{`` that is not a repetition).
"""

from __future__ import annotations

import re
import sys
import warnings

from regional.errors import RegionalConfigError

_LINE_END = "(?=(?:\\r\\n|[\\n\\r\\x85\\u2028\\u2029])?\\Z)"  # Java's \Z: end of input, or before a final line end
_REFUSED_ESCAPES = {
    "p": "a Unicode or POSIX class \\p{...}: Python's re has none; write the class out (e.g. [a-z] for \\p{Lower})",
    "P": "a negated Unicode or POSIX class \\P{...}: Python's re has none; write the class out (e.g. [^a-z])",
    "h": "\\h (horizontal whitespace in Java): Python's re has no such class",
    "H": "\\H (not horizontal whitespace in Java): Python's re has no such class",
    "v": "\\v (vertical whitespace in Java, a single \\x0b in Python)",
    "V": "\\V (not vertical whitespace in Java): Python's re has no such class",
    "R": "\\R (any line break in Java): Python's re has no such matcher",
    "X": "\\X (a grapheme cluster in Java): Python's re has no such matcher",
    "G": "\\G (the end of the previous match in Java): Python's re has no such anchor",
    "U": "\\U (Python's 8-digit escape; Java refuses it)",
}
_JAVA_ESCAPES = set("tnrfa0xuNdDsSwWbBAzZQEkec") | set("123456789") | set(_REFUSED_ESCAPES)
_FLAGS_REFUSED = {
    "d": "UNIX_LINES (Python's re has no such flag)",
    "u": "UNICODE_CASE (Java's Unicode case folding; Python's (?u) means something else)",
    "U": "UNICODE_CHARACTER_CLASS (Python's re has no (?U))",
    "x": "COMMENTS (Java also ignores white space inside classes, Python does not)",
}


def refuse(pattern: str, what: str) -> RegionalConfigError:
    return RegionalConfigError(
        f"source=kafka: subscribePattern {pattern!r} uses {what}. Spark reads the pattern as a Java regular "
        "expression, regional with Python's re, and the two would not select the same topics: rewrite it without "
        "that construct")


def translate(pattern: str) -> str:
    """Python ``re`` syntax for the Java regular expression ``pattern`` (to compile with ``re.ASCII``)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    class_start = 0  # index of the class's first member (after [ and ^)
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                raise refuse(pattern, "a trailing backslash")
            e = pattern[i + 1]
            if e == "Q":  # quoted up to \E (or the end)
                end = pattern.find("\\E", i + 2)
                text = pattern[i + 2:] if end < 0 else pattern[i + 2:end]
                out.append(re.escape(text))
                i = n if end < 0 else end + 2
                continue
            if e.isascii() and e.isalpha() and e not in _JAVA_ESCAPES:
                raise refuse(pattern, f"\\{e}, an escape Java does not define (Java refuses the pattern)")
            if e in _REFUSED_ESCAPES:
                raise refuse(pattern, _REFUSED_ESCAPES[e])
            if e == "b" and pattern.startswith("{", i + 2) and not in_class:
                raise refuse(pattern, "\\b{g} (a grapheme boundary in Java): Python's re has no such anchor")
            if e == "z":
                out.append("\\Z")
                i += 2
            elif e == "Z":
                out.append("\\Z" if in_class else _LINE_END)
                i += 2
            elif e == "e":
                out.append("\\x1b")
                i += 2
            elif e == "c":
                if i + 2 >= n:
                    raise refuse(pattern, "\\c without a control character")
                out.append(f"\\U{ord(pattern[i + 2]) ^ 64:08x}")
                i += 3
            elif e == "0":  # Java: \0 then one to three octal digits (at most 0377)
                m = re.match(r"[0-3][0-7]{0,2}|[0-7]{1,2}", pattern[i + 2:])
                if m is None:
                    raise refuse(pattern, "\\0 without octal digits (Java refuses it)")
                out.append(f"\\x{int(m.group(), 8):02x}")
                i += 2 + len(m.group())
            elif e == "x" and pattern.startswith("{", i + 2):
                end = pattern.find("}", i + 3)
                if end < 0:
                    raise refuse(pattern, "an unclosed \\x{...} escape")
                try:
                    code = int(pattern[i + 3:end], 16)
                    char = chr(code)
                except ValueError:
                    raise refuse(pattern, "a malformed \\x{...} escape") from None
                out.append(re.escape(char) if not in_class else f"\\U{code:08x}")
                i = end + 1
            elif e == "N" and pattern.startswith("{", i + 2):  # a character by its Unicode name: the same in both
                end = pattern.find("}", i + 3)
                if end < 0:
                    raise refuse(pattern, "an unclosed \\N{...} escape")
                out.append(pattern[i:end + 1])
                i = end + 1
            elif e == "k":
                m = re.match(r"<([a-zA-Z][a-zA-Z0-9]*)>", pattern[i + 2:])
                if m is None:
                    raise refuse(pattern, "\\k without a <name> (Java refuses it)")
                out.append(f"(?P={m.group(1)})")
                i += 2 + len(m.group())
            else:
                out.append(pattern[i:i + 2])
                i += 2
            continue
        if in_class:
            if c == "[":
                raise refuse(pattern, "a class inside a class ([a-c[x-z]] is a union in Java, a different class in "
                                      "Python)")
            if c == "&" and pattern.startswith("&&", i):
                raise refuse(pattern, "class intersection && (Java's [a-z&&[^t]]; Python reads '&' as a character)")
            if c == "]" and i > class_start:
                in_class = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            out.append(c)
            i += 1
            if pattern.startswith("^", i):
                out.append("^")
                i += 1
            class_start = i
            continue
        if c == "(" and pattern.startswith("(?", i):
            i = _group(pattern, i, out)
            continue
        if c == "{":
            m = re.match(r"\{(\d+)(,(\d*))?\}", pattern[i:])
            if m is None or not out:
                raise refuse(pattern, "a '{' that is not a repetition {n}, {n,} or {n,m} (Java refuses it; Python "
                                      "reads it otherwise)")
            out.append(m.group())
            i += len(m.group())
            continue
        out.append(c)
        i += 1
    if in_class:
        raise refuse(pattern, "an unclosed class [")
    return "".join(out)


def _group(pattern: str, i: int, out: list[str]) -> int:
    """A ``(?`` construct at ``i``: appended to ``out`` in Python's syntax; returns the index after its opening."""
    rest = pattern[i + 2:]
    for same in (":", "=", "!", "<=", "<!", ">"):
        if rest.startswith(same):
            if same == ">" and sys.version_info < (3, 11):
                raise refuse(pattern, "an atomic group (?>...), which Python's re reads from Python 3.11 on")
            out.append("(?" + same)
            return i + 2 + len(same)
    named = re.match(r"<([a-zA-Z][a-zA-Z0-9]*)>", rest)
    if named:
        out.append(f"(?P<{named.group(1)}>")
        return i + 2 + len(named.group())
    flags = re.match(r"([a-zA-Z]*)(?:-([a-zA-Z]*))?([:)])", rest)
    if flags is None or not (flags.group(1) or flags.group(2)):
        raise refuse(pattern, f"'(?{rest[:1]}', a group Java does not define (Java refuses the pattern)")
    letters = (flags.group(1) or "") + (flags.group(2) or "")
    for letter in letters:
        if letter in _FLAGS_REFUSED:
            raise refuse(pattern, f"the flag (?{letter}), {_FLAGS_REFUSED[letter]}")
        if letter not in "ims":
            raise refuse(pattern, f"the flag (?{letter}), which Java does not define (Java refuses the pattern)")
    if flags.group(3) == ")":
        if i != 0 or flags.group(2) is not None:
            raise refuse(pattern, "flags set in the middle of a pattern or turned off with (?-...); Python's re "
                                  "takes flags for a whole pattern only at its start: scope them, (?i:...)")
    out.append("(?" + flags.group())
    return i + 2 + len(flags.group())


def compile_java(pattern: str) -> re.Pattern[str]:
    """Java ``pattern`` compiled for Python; RegionalConfigError names what cannot be read the same way."""
    translated = translate(pattern)
    try:
        with warnings.catch_warnings():  # [a--b], [a||b]: literal characters in both; Python warns of the future
            warnings.simplefilter("ignore", FutureWarning)
            return re.compile(translated, re.ASCII)
    except re.error as exc:
        if "multiple repeat" in str(exc):  # before Python 3.11: no possessive quantifiers
            raise refuse(pattern, "a possessive quantifier (*+, ++, ?+, {n}+), which Python's re reads from Python "
                                  "3.11 on") from None
        raise RegionalConfigError(f"source=kafka: subscribePattern {pattern!r} is not a valid regular expression: "
                                  f"{exc}") from None
