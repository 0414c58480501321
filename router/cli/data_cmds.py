"""``sievekv put | get | delete | scan | load``: the data path, through the router.

Keys and values are given and printed in ``--encoding`` (text, hex, base64; see codec.py).
``get`` prints the value and a newline; in text encoding the value's bytes are written as
they are. An absent key exits 5 (NOT_FOUND) with a one-line message. ``scan`` writes records
in the format ``load`` reads (records.py), so a scan can be loaded back. ``load`` sends batches
of ``--batch`` records (and at most 1 MiB) as atomic-per-shard Write calls; progress goes to
stderr. If a batch fails, ``load`` stops, says which input lines are certainly loaded and
which shards applied the failed batch, and exits 4 (PARTIAL) when anything was loaded.
"""

from __future__ import annotations

import sys
import time

from ..client_errors import ClientError, PartialWriteError
from ..humanize import format_bytes, format_count
from . import target
from .codec import decode, encode
from .exit_codes import NOT_FOUND, OK, PARTIAL, USAGE, CliError, code_for_grpc, from_client_error
from .records import format_record, guess_format, iter_records

DEFAULT_TIMEOUT = 30.0
BATCH_BYTES = 1 << 20


def _client(args):
    from ..client import Client

    address = target.router_address(args)
    kw = {}
    limit = target.max_value_size(args)
    if limit is not None:
        kw["max_value_bytes"] = limit
    return Client(address, timeout=getattr(args, "timeout", None) or DEFAULT_TIMEOUT, **kw)


def _arg(s: str | None, args, what: str) -> bytes | None:
    if s is None:
        return None
    try:
        b = decode(s, args.encoding)
    except ValueError as exc:
        raise CliError(f"{what}: {exc}", USAGE) from None
    return b


def _key(args) -> bytes:
    k = _arg(args.key, args, "key")
    if not k:
        raise CliError("key: must not be empty", USAGE)
    return k


def _call(what: str, fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except ClientError as exc:
        raise from_client_error(exc, what) from None


def cmd_put(args) -> int:
    key, value = _key(args), _arg(args.value, args, "value")
    with _client(args) as c:
        _call("put", c.put, key, value, sync=True if args.sync else None)
    print("OK")
    return OK


def cmd_get(args) -> int:
    key = _key(args)
    with _client(args) as c:
        value = _call("get", c.get, key)
    if value is None:
        raise CliError(f"key {args.key!r} not found", NOT_FOUND)
    out = sys.stdout.buffer
    if args.encoding == "text":
        out.write(value + b"\n")
    else:
        out.write((encode(value, args.encoding) + "\n").encode("ascii"))
    out.flush()
    return OK


def cmd_delete(args) -> int:
    key = _key(args)
    with _client(args) as c:
        _call("delete", c.delete, key, sync=True if args.sync else None)
    print("OK")
    return OK


def cmd_scan(args) -> int:
    start, end = _arg(args.start, args, "--start"), _arg(args.end, args, "--end")
    if args.limit < 0:
        raise CliError("--limit: must be >= 0", USAGE)
    if start is not None and end is not None and start >= end:
        raise CliError("--start must be before --end", USAGE)
    out = sys.stdout.buffer
    n = 0
    with _client(args) as c:
        try:
            for key, value in c.scan(start=start or b"", end=end or b"", limit=args.limit):
                try:
                    out.write(format_record(key, value, args.format, args.encoding))
                except ValueError as exc:
                    raise CliError(f"after {n} entries: {exc}", USAGE) from None
                n += 1
        except ClientError as exc:
            out.flush()
            raise from_client_error(exc, f"scan (after {n} entries)") from None
    out.flush()
    return OK


# ---------------------------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------------------------

class _Progress:
    """Progress on stderr: a rewritten line on a terminal, a line every 5 s otherwise."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.t0 = self.last = time.monotonic()

    def update(self, records: int, nbytes: int, final: bool = False) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if not final and now - self.last < (0.2 if self.tty else 5.0):
            return
        self.last = now
        el = max(now - self.t0, 1e-9)
        msg = (f"loaded {format_count(records)} records ({format_bytes(nbytes)}) in {el:.1f}s, "
               f"{format_count(int(records / el))} records/s")
        if self.tty:
            print(f"\r{msg}\033[K", end="\n" if final else "", file=sys.stderr, flush=True)
        else:
            print(msg, file=sys.stderr, flush=True)


def _open_input(path: str):
    if path == "-":
        return sys.stdin.buffer, None
    try:
        return open(path, "rb"), path
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}", USAGE) from None


def cmd_load(args) -> int:
    if args.batch < 1:
        raise CliError("--batch: must be >= 1", USAGE)
    stream, path = _open_input(args.file)
    first = stream.readline()
    fmt = args.format if args.format != "auto" else guess_format(path, first)
    progress = _Progress(args.quiet)
    loaded = nbytes = 0
    batch: list[tuple[bytes, bytes]] = []
    batch_bytes = 0
    first_line = last_line = 0
    sync = True if args.sync else None
    try:
        with _client(args) as c:
            def send():
                nonlocal loaded, nbytes, batch, batch_bytes
                try:
                    c.write(batch, sync=sync)
                except ClientError as exc:
                    raise _load_failure(exc, loaded, first_line, last_line) from None
                loaded += len(batch)
                nbytes += batch_bytes
                batch, batch_bytes = [], 0
                progress.update(loaded, nbytes)

            try:
                for lineno, key, value in iter_records(stream, fmt, args.encoding, first):
                    if not batch:
                        first_line = lineno
                    batch.append((key, value))
                    batch_bytes += len(key) + len(value)
                    last_line = lineno
                    if len(batch) >= args.batch or batch_bytes >= BATCH_BYTES:
                        send()
            except ValueError as exc:
                where = path or "stdin"
                if batch:
                    send()  # records before the bad line are good: keep them
                raise CliError(f"{where}: {exc}; the {loaded} record(s) before it were loaded",
                               USAGE) from None
            if batch:
                send()
    finally:
        if path is not None:
            stream.close()
    progress.update(loaded, nbytes, final=True)
    return OK


def _load_failure(exc: ClientError, loaded: int, first: int, last: int) -> CliError:
    """Explain a failed batch: what is certainly loaded, which shards applied the batch."""
    applied, failed = [], []
    if isinstance(exc, PartialWriteError):
        for r in exc.results:
            (applied if r.applied else failed).append(r.shard)
    lines = (exc.details or "").strip().splitlines()
    detail = lines[0] if lines else ""
    msg = (f"load stopped: the batch of input lines {first}-{last} failed "
           f"({exc.code.name}: {detail}); the {loaded} records before line {first} are loaded")
    if applied:
        msg += (f"; of that batch, shards {', '.join(applied)} applied their part and "
                f"{', '.join(failed)} did not")
    partial = loaded > 0 or bool(applied)
    return CliError(msg, PARTIAL if partial else code_for_grpc(exc.code))
