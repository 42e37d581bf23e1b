"""The rules of the servers the tests start (tests/free_ports.py, tests/ray_head.py), without starting them."""
import os
import random
import shutil
import socket

import pytest

from free_ports import LOWEST_PORT, ephemeral_low, free_port_block
from ray_head import RayHead, start_proven_head


def test_a_port_block_is_free_and_below_the_ephemeral_range():
    block = free_port_block(209, random.Random(3))
    assert block == list(range(block[0], block[0] + 209))
    assert LOWEST_PORT <= block[0] and block[-1] < ephemeral_low()
    for p in block:
        with socket.socket() as s:
            s.bind(("", p))


def test_a_taken_port_is_never_in_a_block():
    taken = free_port_block(9, random.Random(5))
    with socket.socket() as s:
        s.bind(("", taken[4]))
        assert taken[4] not in free_port_block(9, random.Random(5))


def test_a_head_that_fails_to_come_up_is_started_once_more(monkeypatch, capsys):
    starts = []

    def start(self):
        starts.append(self.temp_dir)
        if len(starts) == 1:
            raise RuntimeError("agent died")
        self.address = "http://127.0.0.1:1"

    monkeypatch.setattr(RayHead, "start", start)
    monkeypatch.setattr(RayHead, "prove", lambda self: 0.5)
    head = start_proven_head({})
    assert len(starts) == 2 and head.temp_dir == starts[1]
    assert not os.path.exists(starts[0])            # the failed try's temp dir is gone
    shutil.rmtree(head.temp_dir)
    out = capsys.readouterr().out
    assert "try 1: agent died" in out and "first job in 0.5 s (try 2)" in out


def test_a_head_that_never_comes_up_fails_naming_each_try(monkeypatch):
    monkeypatch.setattr(RayHead, "start", lambda self: (_ for _ in ()).throw(RuntimeError("port taken")))
    with pytest.raises(RuntimeError, match=r"(?s)did not come up.*try 1: port taken.*try 2: port taken"):
        start_proven_head({})
