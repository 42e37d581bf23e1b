"""Ports for the servers the tests start (a Ray head, PostgreSQL), picked free below the kernel's ephemeral range.

A port picked free inside that range and released until the server binds it can be taken meanwhile as the local end
of any outgoing connection on the machine (a test's Ray cluster opens many); below the range only an explicit bind
takes it."""
from __future__ import annotations

import random
import socket

LOWEST_PORT = 20000            # Ray's own default worker ports are 10002-19999


def ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


def free_port_block(n: int, rng: random.Random | None = None) -> list[int]:
    """`n` consecutive ports, each free now, between LOWEST_PORT and the ephemeral range."""
    rng = rng or random.Random()
    high = ephemeral_low()
    for _ in range(200):
        base = rng.randrange(LOWEST_PORT, high - n)
        block = list(range(base, base + n))
        if all(is_free(p) for p in block):
            return block
    raise RuntimeError(f"no free block of {n} ports between {LOWEST_PORT} and {high}")
