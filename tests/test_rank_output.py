"""A run's rank output on the driver's console as the ranks print it
(raydist.train._rank_output): the server and the tasks' senders over real
sockets on loopback."""

from __future__ import annotations

import socket

import pytest

from raydist.train._rank_output import OutputSender, OutputServer

pytestmark = pytest.mark.component


def test_ranks_lines_print_whole_and_only_from_the_runs_own_tasks(capsys) -> None:
    server = OutputServer("127.0.0.1")
    host, port, key = server.where
    # Something else on the network, without the run's key: nothing it sends is printed.
    with socket.create_connection((host, port)) as stranger:
        stranger.sendall(b"x" * 16 + b"\x00\x00\x00\x00\x00\x00\x00\x06forged")
    wrong = OutputSender((host, port, b"y" * 16))
    wrong.send(0, b"forged too\n")
    wrong.close()

    rank0, rank1 = OutputSender(server.where), OutputSender(server.where)
    assert rank0.live and rank1.live
    assert rank0.send(0, b"epoch 1 lo")
    assert rank1.send(1, b"rank 1 here\n")
    assert rank0.send(0, b"ss 0.5\nepoch 2")  # a line in two chunks, and one left unfinished
    rank0.close()
    rank1.close()
    server.close()
    printed = capsys.readouterr().out
    assert "forged" not in printed
    assert sorted(printed.splitlines()) == ["epoch 1 loss 0.5", "epoch 2", "rank 1 here"]


def test_a_sender_that_cannot_reach_the_driver_says_so() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: the dial is refused
        sender = OutputSender(("127.0.0.1", port, b"k" * 16))
    assert not sender.live and not sender.send(0, b"kept for the end\n")
