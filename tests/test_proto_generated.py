"""The committed generated code matches proto/ (regenerated into a temp dir), and is importable
only as the ``sievekv_proto`` package."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "sievekv_proto")


def test_generated_code_matches_proto(tmp_path):
    pytest.importorskip("grpc_tools")
    out = tmp_path / "gen"
    subprocess.run([sys.executable, os.path.join(REPO, "scripts", "gen_proto.py"), "--out", str(out)],
                   check=True, capture_output=True)
    fresh = sorted(p for p in os.listdir(out) if p.endswith((".py", ".pyi")))
    committed = sorted(p for p in os.listdir(PACKAGE) if p.endswith((".py", ".pyi")))
    assert fresh == committed
    for name in fresh:
        with open(out / name, encoding="utf-8") as a, open(os.path.join(PACKAGE, name), encoding="utf-8") as b:
            assert a.read() == b.read(), f"sievekv_proto/{name} is stale: run python3 scripts/gen_proto.py"


def test_grpc_module_imports_relatively():
    with open(os.path.join(PACKAGE, "sievekv_pb2_grpc.py"), encoding="utf-8") as f:
        text = f.read()
    assert "from . import sievekv_pb2" in text
    assert "\nimport sievekv_pb2" not in text


def test_contract_shape():
    from sievekv_proto import sievekv_pb2 as pb

    services = pb.DESCRIPTOR.services_by_name
    assert pb.DESCRIPTOR.package == "sievekv.v1"
    assert [m.name for m in services["KV"].methods] == ["Get", "Put", "Delete", "MultiGet", "Write", "Scan"]
    assert [m.name for m in services["Admin"].methods] == ["Stats", "FilterReport", "Flush", "Compact",
                                                          "Verify", "Checkpoint", "ClusterInfo"]
    assert services["KV"].methods_by_name["Scan"].server_streaming
    assert not any(m.server_streaming for m in services["Admin"].methods)
    assert pb.GetRequest.DESCRIPTOR.fields_by_name["key"].type == pb.GetRequest.DESCRIPTOR.fields_by_name["key"].TYPE_BYTES
    assert not pb.PutRequest(key=b"k").HasField("sync")  # absent = the engine's default


def test_generated_modules_are_not_top_level(tmp_path):
    # proto/ holds .proto files only (``proto`` is Google's proto-plus), and no generated
    # module is importable as a bare top-level name.
    assert not [n for n in os.listdir(os.path.join(REPO, "proto")) if n.endswith(".py")]
    code = ("import importlib.util, sys; sys.path.insert(0, %r); import sievekv_proto;"
            "assert importlib.util.find_spec('sievekv_pb2') is None;"
            "assert importlib.util.find_spec('sievekv_pb2_grpc') is None" % REPO)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)
