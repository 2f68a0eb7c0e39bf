"""The operations endpoint's server (pipeline/worker/operations.py) without a worker: its
port, its paths. The endpoint on a running worker: tests/integration/test_operations.py."""

from __future__ import annotations

import socket

import pytest

from dpstream.config.schema import ConfigError
from dpstream.pipeline.worker.operations import bind


def test_a_port_already_taken_names_the_config_field():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=r"metrics\.port: .*127\.0\.0\.1:\d+"):
            bind("127.0.0.1", port)


def test_bind_takes_a_free_port_without_serving_yet():
    server = bind("127.0.0.1", 0)
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1" and port > 0
    finally:
        server.server_close()
