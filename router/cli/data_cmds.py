"""``sievekv put | get | delete | scan | load``: the data path, through the router.

Keys and values are given and printed in ``--encoding`` (text, hex, base64; see codec.py);
``put KEY -`` and ``--value-file`` take the value's raw bytes (value_source.py).
``get`` prints the value and a newline; in text encoding the value's bytes are written as
they are. An absent key exits 5 (NOT_FOUND) with a one-line message. ``scan`` writes records
in the format ``load`` reads (records.py), so a scan can be loaded back. ``load`` sends batches
of ``--batch`` records (and at most BATCH_BYTES of protobuf) as atomic-per-shard Write calls;
progress goes to stderr. A record over the cluster's limits (sizes.py) or a bad input line
stops ``load`` before it is sent: the records before it are loaded, the line is named, exit 2.
If a batch fails, ``load`` stops, says which input lines are certainly loaded and which shards
applied the failed batch, and exits 4 (PARTIAL) when anything was loaded.
"""

from __future__ import annotations

import sys
import time

from shard.limits import Limits

from ..client_errors import ClientError, PartialWriteError
from ..humanize import format_bytes, format_count, format_counted
from . import target
from .codec import decode, encode
from .exit_codes import (BUSY, INTERRUPTED, NOT_FOUND, OK, PARTIAL, USAGE, CliError,
                         code_for_grpc, from_client_error)
from .progress import StatusLine
from .records import format_record, guess_format, iter_records
from .sizes import SYNC_FIELD_BYTES, cluster_limits, mutation_bytes, record_problem
from .value_source import read_value

DEFAULT_TIMEOUT = 30.0
BATCH_BYTES = 1 << 20  # largest Write of several records, protobuf bytes (sizes.py)
MAX_SCAN_LIMIT = 2**64 - 2  # Client.scan's: a resumed scan asks for one more (ScanRequest.limit, uint64)


def _client(args, limits: Limits | None = None):
    """A Client for the router, its messages sized by the cluster's limits (sizes.py)."""
    from ..client import Client
    from . import rpc

    address = target.router_address(args)
    limits = limits or cluster_limits(args)
    return Client(address, timeout=getattr(args, "timeout", None) or DEFAULT_TIMEOUT,
                  max_value_bytes=limits.max_value_bytes, **rpc.client_tls_args())


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
    key = _key(args)
    limits = cluster_limits(args)
    value = read_value(args, key, limits)
    with _client(args, limits) as c:
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
    if not 0 <= args.limit <= MAX_SCAN_LIMIT:
        raise CliError(f"--limit: must be in 0..{MAX_SCAN_LIMIT}", USAGE)
    if start is not None and end is not None and start >= end:
        raise CliError("--start must be before --end", USAGE)
    out = sys.stdout.buffer
    n = 0
    # The deadline covers the whole stream: none by default (a dump of a large cluster takes
    # minutes), so only --timeout bounds it.
    from ..client import MAX_TIMEOUT

    timeout = getattr(args, "timeout", None) or MAX_TIMEOUT
    with _client(args) as c:
        try:
            for key, value in c.scan(start=start or b"", end=end or b"", limit=args.limit,
                                     timeout=timeout):
                try:
                    out.write(format_record(key, value, args.format, args.encoding))
                except ValueError as exc:
                    raise CliError(f"scan stopped after {n} entries: {exc}", USAGE) from None
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
    """``load``'s progress: records, bytes and records/s on a :class:`StatusLine` (rewritten
    up to 5 times a second on a terminal, a line every 5 s otherwise)."""

    def __init__(self, quiet: bool):
        self.line = StatusLine(quiet, tty_every=0.2, plain_every=5.0)
        self.t0 = time.monotonic()

    def update(self, records: int, nbytes: int, final: bool = False) -> None:
        el = max(time.monotonic() - self.t0, 1e-9)
        rate = records / el
        rate_text = f"{rate:.1f}" if rate < 10 else format_count(int(rate))
        self.line.show(f"loaded {format_counted(records, 'record')} ({format_bytes(nbytes)}) in "
                       f"{el:.1f}s, {rate_text} records/s", final)

    def waiting(self, records: int, why: str, seconds: float, waited: float) -> None:
        """A line (always shown, unless quiet: each names the time waited so far, so no two
        are equal and none is dropped) saying that a busy batch is sent again."""
        self.line.show(f"loaded {format_counted(records, 'record')}; a shard is busy ({why}); "
                       f"sending the batch again in {seconds:g}s ({waited:.1f}s waited for "
                       f"it so far)", True)

    def end_line(self) -> None:
        self.line.end_line()


BUSY_RETRY_FIRST_S = 0.5
BUSY_RETRY_MAX_S = 5.0
BUSY_WAIT_MAX_S = 1e6  # as --timeout: a bound, never "for ever"


def _busy(exc: ClientError) -> bool:
    """The batch failed only because shards were busy (RESOURCE_EXHAUSTED that is not about a
    size limit: a write stall that gave up before its deadline, or a full disk): nothing of
    it was applied where it failed, and sending it again later may succeed."""
    if isinstance(exc, PartialWriteError):
        failed = [(r.code, r.message) for r in exc.results if not r.applied]
    else:
        failed = [(exc.code, exc.details)]
    return bool(failed) and all(code_for_grpc(c, d) == BUSY for c, d in failed)


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
    if not 0 <= args.busy_wait <= BUSY_WAIT_MAX_S:
        raise CliError(f"--busy-wait: must be 0 to {BUSY_WAIT_MAX_S:.0f} seconds, got "
                       f"{args.busy_wait:g}", USAGE)
    stream, path = _open_input(args.file)
    first = stream.readline()
    fmt = args.format if args.format != "auto" else guess_format(path, first)
    progress = _Progress(args.quiet)
    loaded = nbytes = 0
    batch: list[tuple[bytes, bytes]] = []
    batch_bytes = 0  # keys and values, for the progress line
    sync = True if args.sync else None
    empty_wire = SYNC_FIELD_BYTES if sync is not None else 0
    batch_wire = empty_wire  # the batch's WriteRequest, protobuf bytes
    first_line = last_line = 0
    sending = False  # a Write is in flight: its batch may or may not be applied
    done_line = 0  # the last input line of the last batch that was applied
    try:
        with _client(args) as c:
            def send():
                nonlocal loaded, nbytes, batch, batch_bytes, batch_wire, sending, done_line
                sending = True
                delay, busy_since = BUSY_RETRY_FIRST_S, None
                applied_before: set[str] = set()  # shards that applied their part in a try
                while True:
                    try:
                        c.write(batch, sync=sync)
                        break
                    except ClientError as exc:
                        # Busy shards applied nothing (the others applied their part, and
                        # applying it again stores the same values): wait and send it again,
                        # for at most --busy-wait seconds in a row.
                        now = time.monotonic()
                        busy_since = busy_since or now
                        if not _busy(exc) or now - busy_since + delay > args.busy_wait:
                            raise _load_failure(exc, loaded, first_line, last_line,
                                                applied_before) from None
                        if isinstance(exc, PartialWriteError):
                            applied_before.update(r.shard for r in exc.results if r.applied)
                        why = (exc.details or "").strip().splitlines()
                        progress.waiting(loaded, why[0] if why else exc.code.name, delay,
                                         now - busy_since)
                        time.sleep(delay)
                        delay = min(delay * 2, BUSY_RETRY_MAX_S)
                sending = False
                done_line = last_line
                loaded += len(batch)
                nbytes += batch_bytes
                batch, batch_bytes, batch_wire = [], 0, empty_wire
                progress.update(loaded, nbytes)

            try:
                for lineno, key, value in iter_records(stream, fmt, args.encoding, first):
                    # A record the cluster refuses is reported with its line before anything
                    # is sent; a batch of several records stays within BATCH_BYTES, which
                    # every message limit (value limit + 1 MiB) admits.
                    problem = record_problem(key, value, c.limits, sync)
                    if problem is not None:
                        raise ValueError(f"line {lineno}: record too large: {problem}")
                    size = mutation_bytes(len(key), len(value))
                    if batch and batch_wire + size > BATCH_BYTES:
                        send()
                    if not batch:
                        first_line = lineno
                    batch.append((key, value))
                    batch_bytes += len(key) + len(value)
                    batch_wire += size
                    last_line = lineno
                    if len(batch) >= args.batch:
                        send()
            except ValueError as exc:
                where = path or "stdin"
                if batch:
                    send()  # records before the bad line are good: keep them
                raise CliError(f"{where}: {exc}; the {loaded} record(s) before it were loaded",
                               USAGE) from None
            if batch:
                send()
    except KeyboardInterrupt:
        progress.end_line()
        pending = (first_line, last_line) if batch else None
        raise _load_interrupted(loaded, done_line, pending, sending) from None
    except BaseException:
        progress.end_line()  # the error goes on a line of its own, not after the progress
        raise
    finally:
        if path is not None:
            stream.close()
    progress.update(loaded, nbytes, final=True)
    return OK


def _load_interrupted(loaded: int, done_line: int, pending: tuple[int, int] | None,
                      sending: bool) -> CliError:
    """Ctrl-C during ``load``: what is certainly loaded and where to resume.

    Records are sent in input order, so every record up to ``done_line`` (the last line of the
    last applied batch) is loaded. ``pending`` is the current batch's first and last line: if
    its Write was in flight (``sending``) it may or may not be applied; else it was not sent.
    Loading a record again stores the same value, so resuming at the batch is harmless.
    """
    if pending is None:
        if not loaded:
            return CliError("load interrupted: nothing was loaded", INTERRUPTED)
        return CliError(f"load interrupted: {loaded} records loaded, every record up to input "
                        f"line {done_line}; resume from line {done_line + 1}", INTERRUPTED)
    first, last = pending
    one = first == last
    lines = f"line {first}" if one else f"lines {first}-{last}"
    state = (f"{'was' if one else 'were'} being sent and may or may not be loaded" if sending
             else f"{'was' if one else 'were'} read but not sent")
    return CliError(f"load interrupted: {loaded} records loaded, every record before input line "
                    f"{first}; {lines} {state}; resume from line {first}", INTERRUPTED)


def _load_failure(exc: ClientError, loaded: int, first: int, last: int,
                  applied_before=()) -> CliError:
    """Explain a failed batch: what is certainly loaded, which shards applied the batch (in
    its last try, or in an earlier one: ``applied_before``)."""
    applied, failed = [], []
    if isinstance(exc, PartialWriteError):
        for r in exc.results:
            (applied if r.applied or r.shard in applied_before else failed).append(r.shard)
    else:
        applied = sorted(applied_before)
    lines = (exc.details or "").strip().splitlines()
    detail = lines[0] if lines else ""
    which = f"input line {first}" if first == last else f"the batch of input lines {first}-{last}"
    msg = (f"load stopped: {which} failed ({exc.code.name}: {detail}); the {loaded} records "
           f"before line {first} are loaded")
    if applied:
        msg += (f"; of that batch, shards {', '.join(applied)} applied their part and "
                + (f"{', '.join(failed)} did not" if failed else
                   "the others' parts are not known to be applied"))
    partial = loaded > 0 or bool(applied)
    return CliError(msg, PARTIAL if partial else code_for_grpc(exc.code, detail))
