"""A shard worker serving RocksDB (bench/rocks_backend.py) instead of engine.DB.

``python3 bench/rocks_shard.py --data-dir DIR --listen 127.0.0.1:0 --port-file F`` takes the
same options as ``python -m shard``; only the backend differs, so a benchmark through it
compares the storage engines behind identical gRPC hops.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rocks_backend import RocksBackend  # noqa: E402

from shard.worker import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(open_backend=RocksBackend.open, prog="bench/rocks_shard.py"))
