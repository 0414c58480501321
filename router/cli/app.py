"""The ``sievekv`` command line: argument parsing, dispatch and error reporting.

Every command is a function ``cmd_x(args) -> int`` that returns an exit code or raises
:class:`~router.cli.exit_codes.CliError`. :func:`main` turns a CliError, a bad argument or an
unexpected exception into one line ``sievekv: error: ...`` on stderr and the documented exit
code (router/cli/exit_codes.py, docs/cli.md); set ``SIEVEKV_DEBUG=1`` to see tracebacks.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys


def _quiet_grpc() -> None:
    """Import grpc with its core's logging off, for this process only.

    gRPC's core writes failed TLS handshakes ("I... Handshake failed") and some refused calls
    ("E... ssl_utils.cc] call host does not match SSL server name") on stderr; the CLI reports
    each failure in its one error line instead. GRPC_VERBOSITY is read once, when grpc is
    first imported: it is set to NONE for that import only and the environment is given back
    at once, so the processes the CLI starts (`cluster start`: the supervisor, the shards and
    the router) log as the user's environment says. A GRPC_VERBOSITY the user set is left as
    it is (debugging the CLI's own calls)."""
    if "grpc" in sys.modules or "GRPC_VERBOSITY" in os.environ:
        return
    os.environ["GRPC_VERBOSITY"] = "NONE"
    try:
        import grpc  # noqa: F401
    finally:
        os.environ.pop("GRPC_VERBOSITY", None)


_quiet_grpc()

from . import exit_codes  # noqa: E402 (after _quiet_grpc)
from .codec import ENCODINGS  # noqa: E402
from .exit_codes import USAGE, CliError  # noqa: E402

DESCRIPTION = """\
sievekv: run and use a local sharded sievekv cluster.

The cluster is found through --config / $SIEVEKV_CONFIG (its data_dir), --data-dir /
$SIEVEKV_DATA_DIR, or ./sievekv-data; data commands use --router / $SIEVEKV_ROUTER or the
router address recorded by `cluster start`. --tls-ca / $SIEVEKV_TLS_CA (and --tls-cert,
--tls-key for mutual TLS) make every call TLS."""


PUT_EPILOG = """\
values:
  sievekv put KEY VALUE              VALUE decoded by --encoding, like KEY
  sievekv put KEY - < FILE           the value is stdin's raw bytes (no decoding, no newline
                                     stripped, whatever --encoding says about KEY)
  sievekv put KEY --value-file FILE  the value is FILE's raw bytes
  printf %s - | sievekv put KEY -    stores the one-character value "-"
  sievekv put KEY -- -x              a VALUE starting with "-" goes after -- (options
                                     such as --sync before the --)
A value over the cluster's value limit exits 2 with the server's INVALID_ARGUMENT line.

"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2 (USAGE).

    ``late_positional`` (``put``'s "value"): the dest of an optional positional that follows
    a required one. parse_args matches it as absent as soon as an option comes between them
    (``put KEY --sync -- -x``, ``put KEY -e hex VALUE``) and then refuses what follows as
    unrecognized; when that happens, the arguments are parsed again as
    parse_intermixed_args does (options first, then the positionals), and that answer is
    taken if it found the value. Every command line parse_args accepts parses as before."""

    late_positional: str | None = None
    _intermixing = False

    def parse_known_args(self, args=None, namespace=None):
        if self.late_positional is None or self._intermixing:
            return super().parse_known_args(args, namespace)
        args = list(sys.argv[1:] if args is None else args)
        plain = super().parse_known_args(args, copy.copy(namespace))
        if not plain[1] or getattr(plain[0], self.late_positional, None) is not None:
            return plain
        self._intermixing = True  # parse_known_intermixed_args calls parse_known_args
        try:
            mixed = self.parse_known_intermixed_args(args, copy.copy(namespace))
        except CliError:
            return plain  # its error is the one to report
        finally:
            self._intermixing = False
        return mixed if getattr(mixed[0], self.late_positional, None) is not None else plain

    def error(self, message):
        raise CliError(f"{message} (see `{self.prog} --help`)", USAGE)


MAX_SECONDS = 1e6  # = router.client.MAX_TIMEOUT: gRPC deadlines overflow near 9.2e9 s


def _seconds(text: str) -> float:
    """argparse type of --timeout: a positive number of seconds up to MAX_SECONDS (0 or a
    negative deadline would silently mean "the default" or fail every call as unreachable,
    and a huge one fails every call with DEADLINE_EXCEEDED)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < v <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be a positive number of seconds, at most {MAX_SECONDS:.0f}, got {text}")
    return v


def _router(text: str) -> str:
    """argparse type of --router: HOST:PORT with a port in 1..65535 (gRPC would silently
    wrap 99999 into another port)."""
    from .target import check_router_address

    try:
        return check_router_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _common(p: argparse.ArgumentParser, *, router: bool = False,
            timeout_help: str = "deadline of each call (default: 30)", tls: bool = True) -> None:
    """Options every command accepts, before or after the command name. ``tls=False``: the
    command makes no call with the --tls-* options (a local cluster's TLS is its config's
    [tls]); they are hidden from its help and refused (:func:`_check_tls_options`)."""
    g = p.add_argument_group("cluster selection")
    g.add_argument("--config", default=argparse.SUPPRESS, metavar="FILE",
                   help="cluster config (TOML); default: $SIEVEKV_CONFIG or the embedded one")
    g.add_argument("--data-dir", default=argparse.SUPPRESS, metavar="DIR",
                   help="cluster data directory (overrides the config's data_dir)")
    if router:
        g.add_argument("--router", type=_router, default=argparse.SUPPRESS, metavar="HOST:PORT",
                       help="router address; default: $SIEVEKV_ROUTER or the state file")
        g.add_argument("--timeout", type=_seconds, default=argparse.SUPPRESS, metavar="SECONDS",
                       help=timeout_help)
    t = p.add_argument_group("TLS (every call the command makes; default: plaintext)")
    hide = not tls  # accepted, to be refused in one clear line (_check_tls_options)
    t.add_argument("--tls-ca", default=argparse.SUPPRESS, metavar="PEM",
                   help=argparse.SUPPRESS if hide else
                   "connect over TLS, verifying servers with this CA certificate (without it, "
                   "--tls-cert/--tls-key verify servers with gRPC's default root CAs); "
                   "default: $SIEVEKV_TLS_CA")
    t.add_argument("--tls-cert", default=argparse.SUPPRESS, metavar="PEM",
                   help=argparse.SUPPRESS if hide else
                   "client certificate for servers that require mutual TLS (with "
                   "--tls-key); default: $SIEVEKV_TLS_CERT")
    t.add_argument("--tls-key", default=argparse.SUPPRESS, metavar="PEM",
                   help=argparse.SUPPRESS if hide else
                   "private key of --tls-cert; default: $SIEVEKV_TLS_KEY")


def _encoding(p: argparse.ArgumentParser) -> None:
    p.add_argument("--encoding", "-e", choices=ENCODINGS, default="text",
                   help="how keys and values are written: text (default), hex or base64")


def _cmd_restore(args) -> int:
    """``cluster restore``, imported on use: it loads the engine (over a second)."""
    from .restore_cmd import cmd_restore

    return cmd_restore(args)


def _cmd_reshard(args) -> int:
    """``cluster reshard``, imported on use: it loads the engine."""
    from .reshard_cmd import cmd_reshard

    return cmd_reshard(args)


def build_parser() -> argparse.ArgumentParser:
    from . import (bench_cmd, checkpoint_cmd, data_cmds, lifecycle, report_cmds, status,
                   verify_cmd)

    root = _Parser(prog="sievekv", description=DESCRIPTION, epilog=exit_codes.epilog(),
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(root, router=True)
    sub = root.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(parent, name, func, help_, router=False, timeout_help=None, tls=True, **kw):
        kw.setdefault("epilog", exit_codes.epilog())
        p = parent.add_parser(name, help=help_, description=help_,
                              formatter_class=argparse.RawDescriptionHelpFormatter, **kw)
        if timeout_help:
            _common(p, router=router, timeout_help=timeout_help, tls=tls)
        else:
            _common(p, router=router, tls=tls)
        p.set_defaults(func=func, command_parser=p, takes_tls=tls)
        return p

    # -- cluster -------------------------------------------------------------------------
    cl = sub.add_parser("cluster", help="start, stop, inspect a local cluster",
                        description="Run a local cluster: a supervisor process owns the shard "
                                    "and router processes and restarts a shard that dies.")
    csub = cl.add_subparsers(dest="cluster_command", metavar="ACTION", parser_class=_Parser)
    cl.set_defaults(func=lambda a: cl.error("missing ACTION: start, stop, status, restart, "
                                            "restore or reshard"))
    p = command(csub, "start", lifecycle.cmd_start,
                "start the shards and the router in the background; print the router address",
                tls=False)
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    p = command(csub, "stop", lifecycle.cmd_stop,
                "stop every process of the cluster (SIGTERM, then SIGKILL after the timeout)",
                tls=False)
    p.add_argument("--timeout", type=_seconds, metavar="SECONDS", default=argparse.SUPPRESS,
                   help="seconds before SIGKILL (default: the config's stop_timeout)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    p = command(csub, "status", status.cmd_status,
                "a table of the cluster's processes: health, uptime, keys, disk, filters")
    p.add_argument("--json", action="store_true", help="JSON with raw numbers")
    p = command(csub, "restart", lifecycle.cmd_restart,
                "restart one shard (--shard N) or stop and start the whole cluster",
                tls=False)
    p.add_argument("--shard", type=int, metavar="N", help="restart only shard N")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    p = command(csub, "restore", _cmd_restore,
                "replace the stopped cluster's data by a checkpoint (`sievekv checkpoint`): "
                "checks its shards and slot layout, stages and verifies a copy of each, then "
                "moves the old data to DATA_DIR/restore-backup-<time>/ and the copies in place",
                tls=False)
    p.add_argument("checkpoint", nargs="?", metavar="CHECKPOINT_DIR",
                   help="the directory `sievekv checkpoint` wrote (one subdirectory per shard)")
    p.add_argument("--no-verify", action="store_true",
                   help="do not open the staged copies and check every checksum first")
    p.add_argument("--finish", action="store_true",
                   help="finish a restore that was interrupted while swapping directories")
    p.add_argument("--undo", action="store_true",
                   help="undo a restore that was interrupted while swapping directories: put "
                        "the old data back")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    p = command(csub, "reshard", _cmd_reshard,
                "move the stopped cluster's keys to the slot layout of this config (more, fewer "
                "or other shards): rewrites every shard whose slots change, moves their old "
                "data to DATA_DIR/reshard-backup-<time>/ and records the new layout",
                tls=False)
    p.add_argument("--finish", action="store_true",
                   help="finish a reshard that was interrupted while swapping directories")
    p.add_argument("--undo", action="store_true",
                   help="undo a reshard that was interrupted while swapping directories: put "
                        "the old data and layout back")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")

    # -- data ----------------------------------------------------------------------------
    p = command(sub, "put", data_cmds.cmd_put,
                "store VALUE under KEY; VALUE - reads the value from standard input",
                router=True, epilog=PUT_EPILOG + exit_codes.epilog())
    p.late_positional = "value"  # `put KEY --sync -- -x`
    p.add_argument("key")
    p.add_argument("value", nargs="?",
                   help="the value (in --encoding); -: read standard input, raw bytes")
    p.add_argument("--value-file", metavar="PATH",
                   help="read the value from PATH, raw bytes (-: standard input)")
    _encoding(p)
    p.add_argument("--sync", action="store_true", help="fsync the shard's log before replying")
    p = command(sub, "get", data_cmds.cmd_get,
                "print the value of KEY (exit 5 if absent)", router=True)
    p.add_argument("key")
    _encoding(p)
    p = command(sub, "delete", data_cmds.cmd_delete, "delete KEY (absent is fine)", router=True)
    p.add_argument("key")
    _encoding(p)
    p.add_argument("--sync", action="store_true", help="fsync the shard's log before replying")
    p = command(sub, "scan", data_cmds.cmd_scan,
                "print the entries with START <= key < END in key order", router=True,
                timeout_help="give up after this many seconds for the whole scan (default: no "
                             "deadline, so a scan of any size completes)")
    p.add_argument("--start", help="first key (inclusive); default: the first key")
    p.add_argument("--end", help="end key (exclusive); default: past the last key")
    p.add_argument("--limit", type=int, default=0, help="at most this many entries (0: all)")
    p.add_argument("--format", "-f", choices=("tsv", "jsonl"), default="tsv",
                   help="KEY<TAB>VALUE lines (default) or JSON lines; both are `load` input")
    _encoding(p)
    p = command(sub, "load", data_cmds.cmd_load,
                "bulk load KEY/VALUE records from a file or stdin (TSV or JSON lines)",
                router=True)
    p.add_argument("file", nargs="?", default="-", help="input file; - or absent: stdin")
    p.add_argument("--format", "-f", choices=("auto", "tsv", "jsonl"), default="auto",
                   help="input format; auto: by file extension, else by the first line")
    _encoding(p)
    p.add_argument("--batch", type=int, default=1000, metavar="N",
                   help="records per write batch (default 1000; batches also stop at 1 MiB)")
    p.add_argument("--sync", action="store_true", help="fsync each batch on the shards")
    p.add_argument("--busy-wait", type=float, default=300.0, metavar="S",
                   help="a batch that busy shards refused (a write stall, a full disk) is sent "
                        "again, backing off, for at most S seconds in a row (default 300; 0: "
                        "stop at once; at most 1000000)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")

    # -- load test -----------------------------------------------------------------------
    p = command(sub, "bench", bench_cmd.cmd_bench,
                "load test through the router: N client processes call back to back for S "
                "seconds; prints ops/s, latency percentiles, found ratio, errors, client spread",
                router=True)
    p.add_argument("--op", choices=bench_cmd.OPS, default="get",
                   help="get (default), put, mget (--batch keys per call) or mixed (90%% get, "
                        "10%% put); keys are bench:%%010d, picked at random")
    p.add_argument("--clients", type=int, default=4, metavar="N",
                   help="client processes (default 4)")
    p.add_argument("--seconds", type=float, default=10.0, metavar="S",
                   help="measured seconds (default 10)")
    p.add_argument("--keys", type=int, default=100000, metavar="K",
                   help="size of the key space (default 100000)")
    p.add_argument("--value-size", type=int, default=100, metavar="B",
                   help="bytes per value written (default 100)")
    p.add_argument("--batch", type=int, default=100, metavar="M",
                   help="keys per mget call (default 100)")
    p.add_argument("--preload", action="store_true",
                   help="first write all K keys (batched) and flush, so reads find them")
    p.add_argument("--sync", action="store_true", help="puts (and the preload) fsync the log")
    p.add_argument("--json", action="store_true", help="JSON with raw numbers")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")

    # -- reports -------------------------------------------------------------------------
    p = command(sub, "filters", report_cmds.cmd_filters,
                "filter memory per shard and level: on disk, mapped, resident, FPR", router=True)
    p.add_argument("--tables", action="store_true", help="also one row per table")
    p.add_argument("--json", action="store_true", help="JSON with raw numbers")
    p = command(sub, "stats", report_cmds.cmd_stats,
                "engine and service statistics per shard", router=True)
    p.add_argument("--json", action="store_true", help="JSON with raw numbers")
    command(sub, "flush", report_cmds.cmd_flush, "flush every shard's memtable", router=True)
    p = command(sub, "compact", report_cmds.cmd_compact,
                "compact every shard fully; waits until done (no deadline unless --timeout) "
                "and shows each shard's progress on stderr", router=True,
                timeout_help="give up waiting after this many seconds (default: no deadline; "
                             "the shards go on compacting)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    p = command(sub, "verify", verify_cmd.cmd_verify,
                "check every checksum of every table on every shard (reads all table files "
                "again while serving); exit 1 if any is damaged; progress on stderr",
                router=True,
                timeout_help="give up waiting after this many seconds (default: no deadline; "
                             "the shards finish their check)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    p = command(sub, "checkpoint", checkpoint_cmd.cmd_checkpoint,
                "write a consistent copy of every shard's data to DIR/<shard name> on the "
                "shard's host (flushed; tables hard-linked where the file system allows, else "
                "copied); each opens as that shard's data directory", router=True,
                timeout_help="give up waiting after this many seconds (default: no deadline; "
                             "the shards finish their checkpoints)")
    p.add_argument("dir", metavar="DIR", help="a directory that does not exist yet on the "
                   "shards' hosts (made absolute here)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")

    # -- config --------------------------------------------------------------------------
    cf = sub.add_parser("config", help="print or check a cluster config",
                        description="default: the embedded config file; show: the effective "
                                    "config (--config, else $SIEVEKV_CONFIG, else the embedded "
                                    "default) as TOML; check: validate it, print it as JSON.")
    fsub = cf.add_subparsers(dest="config_command", metavar="ACTION", parser_class=_Parser)
    cf.set_defaults(func=lambda a: cf.error("missing ACTION: default, show or check"))
    command(fsub, "default", report_cmds.cmd_config_default,
            "print the embedded default config file (every option, documented); it ignores "
            "--config and $SIEVEKV_CONFIG: see `config show`")
    command(fsub, "show", report_cmds.cmd_config_show,
            "print the effective config (--config, else $SIEVEKV_CONFIG, else the embedded "
            "default; --data-dir / $SIEVEKV_DATA_DIR applied) as TOML with every option "
            "resolved: `config show > f.toml` gives a file `config check --config f.toml` "
            "accepts")
    command(fsub, "check", report_cmds.cmd_config_check,
            "validate the effective config (as `config show` resolves it) and print it "
            "resolved, as JSON")
    root.commands = tuple(sub.choices)  # for the error of a bare `sievekv`
    return root


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``sievekv`` console script. Returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not hasattr(args, "func"):  # bare `sievekv`: one line, like `sievekv cluster`
            names = list(parser.commands)
            parser.error(f"missing COMMAND: {', '.join(names[:-1])} or {names[-1]}")
        _check_root_options(args)
        _check_tls_options(args)
        _check_path_options(args)
        from . import rpc

        rpc.use_tls(args)
        code = args.func(args)
        sys.stdout.flush()
        return code
    except CliError as exc:
        from .rpc import tls_failure

        message, code = tls_failure(str(exc), exc.code)
        _error(message)
        return code
    except KeyboardInterrupt:
        _error("interrupted")
        return exit_codes.INTERRUPTED
    except BrokenPipeError:
        # `sievekv scan | head`: the reader left; that is not an error.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
        return exit_codes.OK
    except Exception as exc:  # a bug: still one line, traceback on request
        if os.environ.get("SIEVEKV_DEBUG"):
            raise
        _error(f"internal error: {type(exc).__name__}: {exc} (SIEVEKV_DEBUG=1 shows the "
               f"traceback)")
        return exit_codes.ERROR


def _check_root_options(args) -> None:
    """An option given before the command name that the command does not take (``sievekv
    --router H:P cluster start``) is an error, as it is after the name, not silently ignored."""
    cmd = getattr(args, "command_parser", None)
    if cmd is None:  # `sievekv cluster` with no action: its own usage error follows
        return
    takes = {a.dest for a in cmd._actions}
    for dest in ("router", "timeout"):
        if hasattr(args, dest) and dest not in takes:
            raise CliError(f"--{dest} does not apply to '{cmd.prog.removeprefix('sievekv ')}'",
                           USAGE)


def _check_tls_options(args) -> None:
    """--tls-ca/--tls-cert/--tls-key (before or after the command name) given to a command
    that makes no call with them (``cluster start``, ``stop``, ``restart``, ``restore``) are
    an error: a local cluster's TLS is its config's [tls] section, and an operator who means
    TLS must not get a plaintext cluster silently. $SIEVEKV_TLS_* are not refused (they are
    meant for every command)."""
    if getattr(args, "takes_tls", True):
        return
    for part in ("ca", "cert", "key"):
        if hasattr(args, f"tls_{part}"):
            name = args.command_parser.prog.removeprefix("sievekv ")
            raise CliError(f"--tls-{part} does not apply to '{name}': a local cluster's TLS is "
                           f"the [tls] section of its config", USAGE)


def _check_path_options(args) -> None:
    """An empty --data-dir or --config (an unset ``"$DIR"``) is an error, not the default: the
    command would otherwise act on the config's data directory, or the embedded config, that
    the operator did not name (``cluster start --data-dir ""`` started a cluster there)."""
    for dest, what in (("config", "the cluster config file"),
                       ("data_dir", "the cluster's data directory")):
        if hasattr(args, dest) and not getattr(args, dest):
            flag = "--" + dest.replace("_", "-")
            raise CliError(f"{flag} is an empty path; give {what}, or leave {flag} out for "
                           f"the default", USAGE)


def _error(message: str) -> None:
    line = " ".join(str(message).split("\n"))
    try:
        print(f"sievekv: error: {line}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
