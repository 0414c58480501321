"""The shard worker: one process serving one engine directory over gRPC (KV + Admin services).

Modules: ``limits`` (key/value/message limits), ``status`` (errors -> gRPC status codes and the
guard around every handler), ``metrics`` (Prometheus), ``serving`` (health, reflection,
draining), ``servicer`` (the KV and Admin servicers over a backend), ``server``
(``create_server``), ``worker`` (the process: ``python -m shard``). The router reuses
``limits``, ``status``, ``metrics`` and ``serving``: both serve the same contract.
"""
