"""Which cluster a command talks to.

* The data directory: ``--data-dir``, else ``$SIEVEKV_DATA_DIR``, else the ``data_dir`` of
  ``--config`` / ``$SIEVEKV_CONFIG``, else the embedded default's (``./sievekv-data``).
* The router address: ``--router``, else ``$SIEVEKV_ROUTER``, else the state file in that data
  directory (written by the supervisor of a running cluster).
* The value limit (what ``put`` and ``load`` check before sending): the ``[limits]
  max_value_size`` of the config in that state file, else of the config itself.

Raises CliError (USAGE for a bad config, UNREACHABLE when there is no running cluster).
"""

from __future__ import annotations

import os

from shard.address import check_address

from .. import cluster_state as cs
from ..config import ClusterConfig, ConfigError, load
from .exit_codes import UNREACHABLE, USAGE, CliError


def config_path(args) -> str | None:
    return getattr(args, "config", None) or os.environ.get("SIEVEKV_CONFIG") or None


def data_dir_override(args) -> str | None:
    """``"--data-dir"`` or ``"$SIEVEKV_DATA_DIR"`` when one replaces the config's data_dir."""
    if getattr(args, "data_dir", None):
        return "--data-dir"
    return "$SIEVEKV_DATA_DIR" if os.environ.get("SIEVEKV_DATA_DIR") else None


def load_config(args, *, check_filters: bool = True) -> ClusterConfig:
    """The config named by the arguments/environment (embedded default if none), with
    --data-dir / $SIEVEKV_DATA_DIR applied. ``check_filters=False``: see router.config.load
    (for commands that only need the data directory, so they do not import numpy)."""
    data_dir = getattr(args, "data_dir", None) or os.environ.get("SIEVEKV_DATA_DIR") or None
    try:
        return load(config_path(args), data_dir=data_dir, check_filters=check_filters)
    except ConfigError as exc:
        raise CliError(str(exc), USAGE) from None


def data_dir(args) -> str:
    explicit = getattr(args, "data_dir", None) or os.environ.get("SIEVEKV_DATA_DIR")
    if explicit:
        return os.path.abspath(explicit)
    return load_config(args, check_filters=False).data_dir


def read_state(args) -> dict:
    try:
        return cs.read_state(data_dir(args))
    except cs.StateError as exc:
        raise CliError(str(exc), UNREACHABLE) from None


def check_router_address(address: str) -> str:
    """``address`` if it is HOST:PORT with a port in 1..65535 and an IPv6 host in brackets
    (``[::1]:50051``); ValueError (one line) if not (gRPC would wrap a port over 65535 into
    another one, or fail to resolve the address and the command would report the cluster as
    unreachable): shard/address.py."""
    return check_address(address)


def router_address(args) -> str:
    explicit = getattr(args, "router", None)
    if explicit:
        return explicit
    env = os.environ.get("SIEVEKV_ROUTER")
    if env:
        try:
            return check_router_address(env)
        except ValueError as exc:
            raise CliError(f"$SIEVEKV_ROUTER: {exc}", USAGE) from None
    doc = read_state(args)
    if doc.get("state") in ("stopped", "failed"):
        raise CliError(f"the cluster in {doc.get('data_dir')} is {doc['state']} "
                       f"(start it with `sievekv cluster start`)", UNREACHABLE)
    addr = doc.get("router_address")
    if not addr:
        raise CliError("the cluster state names no router address", UNREACHABLE)
    return addr


def max_value_size(args) -> int:
    """The cluster's value limit (the client sizes its gRPC messages by it; put and load check
    values against it): from the config recorded in the state file, else from the config
    (--config / $SIEVEKV_CONFIG / the embedded default). A config that cannot be loaded is a
    CliError (USAGE) even when --router makes the state file unnecessary."""
    try:
        doc = cs.read_state(data_dir(args))
    except cs.StateError:
        doc = {}
    limit = doc.get("config", {}).get("limits", {}).get("max_value_size")
    if isinstance(limit, int):
        return limit
    return load_config(args, check_filters=False).limits.max_value_size
