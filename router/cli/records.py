"""Key-value records as lines of text: what ``load`` reads and ``scan`` writes.

Two formats, each one record per line, so ``scan`` output can be fed back to ``load``:

* ``tsv``: ``KEY<TAB>VALUE``. The line is split at its first tab, so in text encoding a value
  may contain tabs but a key may not; neither may contain a newline (a trailing ``\\r`` of a
  CRLF line is dropped). Text TSV is taken byte for byte, no escapes. Blank lines (only
  whitespace, no tab) are skipped.
* ``jsonl``: ``{"key": "...", "value": "..."}``; JSON escapes make any text safe.

``--encoding`` (router/cli/codec.py) applies to each key and value field: with hex or base64
any bytes at all round-trip through either format.

Errors name the line: ``ValueError("line 7: expected KEY<TAB>VALUE")``. Records a format
cannot represent raise ValueError when written, never come out altered.
"""

from __future__ import annotations

import json
from typing import BinaryIO, Iterator

from .codec import decode, encode

FORMATS = ("tsv", "jsonl")


def guess_format(path: str | None, first_line: bytes) -> str:
    """``jsonl`` for *.jsonl/*.ndjson/*.json or a first line starting with ``{``, else tsv."""
    if path:
        lower = path.lower()
        if lower.endswith((".jsonl", ".ndjson", ".json")):
            return "jsonl"
        if lower.endswith((".tsv", ".tab")):
            return "tsv"
    return "jsonl" if first_line.lstrip().startswith(b"{") else "tsv"


def iter_records(stream: BinaryIO, fmt: str, encoding: str,
                 first_line: bytes | None = None) -> Iterator[tuple[int, bytes, bytes]]:
    """Yield ``(line_number, key, value)`` for each record of ``stream``.

    ``first_line``, when given, is a line already read from ``stream`` (format sniffing).
    """
    def lines():
        n = 0
        if first_line is not None:
            n += 1
            yield n, first_line
        for line in stream:
            n += 1
            yield n, line

    parse = _parse_tsv if fmt == "tsv" else _parse_jsonl
    for n, raw in lines():
        line = raw[:-1] if raw.endswith(b"\n") else raw
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line.strip() and (fmt != "tsv" or b"\t" not in line):
            continue  # a blank line; " \t " is a record (key " "), as scan writes it
        try:
            key, value = parse(line, encoding)
        except ValueError as exc:
            raise ValueError(f"line {n}: {exc}") from None
        if not key:
            raise ValueError(f"line {n}: empty key")
        yield n, key, value


def _parse_tsv(line: bytes, encoding: str) -> tuple[bytes, bytes]:
    key, sep, value = line.partition(b"\t")
    if not sep:
        raise ValueError("expected KEY<TAB>VALUE (no tab found)")
    if encoding == "text":
        return key, value
    try:
        return decode(key.decode("ascii"), encoding), decode(value.decode("ascii"), encoding)
    except UnicodeDecodeError:
        raise ValueError(f"not valid {encoding} (non-ASCII bytes)") from None


def _parse_jsonl(line: bytes, encoding: str) -> tuple[bytes, bytes]:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"invalid JSON: {exc}") from None
    if not isinstance(obj, dict) or "key" not in obj or "value" not in obj:
        raise ValueError('expected an object {"key": ..., "value": ...}')
    k, v = obj["key"], obj["value"]
    if not isinstance(k, str) or not isinstance(v, str):
        raise ValueError("key and value must be JSON strings")
    if encoding == "text":
        try:
            return k.encode("utf-8"), v.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("key or value is not valid Unicode text") from None
    return decode(k, encoding), decode(v, encoding)


def format_record(key: bytes, value: bytes, fmt: str, encoding: str) -> bytes:
    """One output line (with its newline) for ``scan``; ValueError if ``fmt`` cannot carry it.

    The error names the record's key, which field is the problem and why, e.g.
    ``the record with key b'photo:1': its value has a newline, which text TSV cannot carry``.
    """
    if fmt == "jsonl":
        if encoding == "text":
            for name, field in (("key", key), ("value", value)):
                try:
                    field.decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError(f"the record with key {_show_key(key)}: its {name} is not "
                                     f"UTF-8 text, which JSON output needs; use --encoding hex "
                                     f"or base64") from None
        return (json.dumps({"key": encode(key, encoding), "value": encode(value, encoding)},
                           ensure_ascii=False) + "\n").encode("utf-8")
    if encoding == "text":
        problem = _tsv_problem(key, value)
        if problem:
            raise ValueError(f"the record with key {_show_key(key)}: {problem}, which text TSV "
                             f"cannot carry; use --encoding hex or base64 (or --format jsonl)")
        return key + b"\t" + value + b"\n"
    return (encode(key, encoding) + "\t" + encode(value, encoding) + "\n").encode("ascii")


def _tsv_problem(key: bytes, value: bytes) -> str | None:
    """Why a text TSV line cannot carry this record (None if it can)."""
    if b"\t" in key:
        return "its key has a tab"
    for name, field in (("key", key), ("value", value)):
        if b"\n" in field:
            return f"its {name} has a newline"
        if field.endswith(b"\r"):
            return f"its {name} ends with a carriage return"
    return None


def _show_key(key: bytes) -> str:
    return repr(key if len(key) <= 40 else key[:37] + b"...")
