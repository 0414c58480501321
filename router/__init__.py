"""The stateless router (``python -m router``), its cluster map, and the client library.

Service modules: ``slots`` (key -> slot), ``cluster_map`` (slot -> shard, TOML), ``shards``
(one channel per shard), ``kv_servicer``/``admin_servicer``/``merge`` (the services for the
whole cluster), ``deadlines``, ``server`` (``create_router_server``), ``worker`` (the process
and the SO_REUSEPORT supervisor), ``client``/``client_errors`` (the library for applications),
``wire_sizes`` (bytes a request takes in a message: the client's and the CLI's batches).
The operator CLI (``router/cli/``, ``config``) and the local-cluster supervisor live beside them.
"""
