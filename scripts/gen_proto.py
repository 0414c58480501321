"""Generate the ``sievekv_proto`` package from ``proto/*.proto`` with grpc_tools.protoc.

Usage: ``python3 scripts/gen_proto.py [--out DIR]`` (default: ``sievekv_proto/`` in the repo).

protoc writes ``import sievekv_pb2`` (a top-level import) into the ``*_pb2_grpc.py`` modules;
this script rewrites those into package-relative imports so the generated code is importable
only as ``sievekv_proto.*`` (never as a bare top-level module, and never as ``proto``, the name
of Google's proto-plus). tests/test_proto_generated.py regenerates into a temporary directory
and fails when the committed code differs.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO_DIR = os.path.join(REPO, "proto")
DEFAULT_OUT = os.path.join(REPO, "sievekv_proto")

INIT = '''"""Generated gRPC/protobuf code for the sievekv contract (proto/sievekv.proto).

Do not edit: regenerate with ``python3 scripts/gen_proto.py``.
"""

from . import sievekv_pb2, sievekv_pb2_grpc

__all__ = ["sievekv_pb2", "sievekv_pb2_grpc"]
'''

_TOP_LEVEL_IMPORT = re.compile(r"^import (\w+_pb2) as (\w+)$", re.MULTILINE)


def proto_files() -> list[str]:
    """The .proto files of the contract, sorted, relative to ``proto/``."""
    return sorted(name for name in os.listdir(PROTO_DIR) if name.endswith(".proto"))


def generate(out_dir: str) -> list[str]:
    """Write the generated package into ``out_dir``; return the file names written (sorted).

    Raises RuntimeError when protoc fails.
    """
    from grpc_tools import protoc  # imported here: a test-only dependency
    import importlib.resources

    os.makedirs(out_dir, exist_ok=True)
    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *proto_files(),
    ]
    cwd = os.getcwd()
    os.chdir(PROTO_DIR)
    try:
        rc = protoc.main(args)
    finally:
        os.chdir(cwd)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc}")
    for name in os.listdir(out_dir):
        if name.endswith("_pb2_grpc.py"):
            path = os.path.join(out_dir, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            text = _TOP_LEVEL_IMPORT.sub(r"from . import \1 as \2", text)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    with open(os.path.join(out_dir, "__init__.py"), "w", encoding="utf-8") as f:
        f.write(INIT)
    return sorted(n for n in os.listdir(out_dir) if n.endswith((".py", ".pyi")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="output package directory")
    args = parser.parse_args(argv)
    for name in generate(args.out):
        print(os.path.join(args.out, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
