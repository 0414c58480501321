"""shard/address.py: the HOST:PORT rule of --listen, --router and Client (session 20)."""

from __future__ import annotations

import argparse

import pytest

from shard.address import check_address, listen_address_arg


@pytest.mark.parametrize("address", ["127.0.0.1:1", "localhost:50051", "[::1]:65535",
                                     "0.0.0.0:8080", "[::]:7000"])
def test_good_addresses_are_returned_unchanged(address):
    assert check_address(address) == address
    assert listen_address_arg(address) == address


@pytest.mark.parametrize("address, message", [
    ("127.0.0.1:65536", "must be in 1..65535"),
    ("127.0.0.1:99999", "must be in 1..65535"),
    ("127.0.0.1:0", "must be in 1..65535"),
    ("127.0.0.1", "expected host:port"),
    (":50051", "expected host:port"),
    ("[]:50051", "expected host:port"),
    ("127.0.0.1:", "is not a number"),
    ("127.0.0.1:-1", "is not a number"),
    ("127.0.0.1:５", "is not a number"),  # a digit, but not an ASCII one
    ("::1:50051", "IPv6 host in brackets"),
    ("[::1]]:50051", "IPv6 host in brackets"),
])
def test_bad_addresses_name_the_problem(address, message):
    with pytest.raises(ValueError, match=message):
        check_address(address)


def test_listen_takes_port_0_and_refuses_a_port_past_65535():
    assert check_address("127.0.0.1:0", listen=True) == "127.0.0.1:0"
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be in 0\.\.65535"):
        listen_address_arg("127.0.0.1:65536")


@pytest.mark.parametrize("address", [None, 50051, b"127.0.0.1:1"])
def test_a_non_string_is_a_type_error(address):
    with pytest.raises(TypeError, match="host:port"):
        check_address(address)
