"""JobBoard, the warm run's job board, driven directly (no Ray)."""

from __future__ import annotations

import asyncio

import pytest

from raydist.train._board import PENDING, JobBoard

pytestmark = pytest.mark.unit


def run(coro):
    return asyncio.run(coro)


def test_a_job_goes_to_every_rank_and_rank_0s_value_comes_back() -> None:
    async def main() -> None:
        board = JobBoard(keep_warm_s=60)
        gen = await board.new_generation(2)
        for rank in (0, 1):
            await board.register(gen, rank, f"actor{rank}")
        assert await board.ready()
        seq = await board.submit(b"job")
        assert await board.next_job(gen, 0) == (seq, b"job", None)
        await board.publish_rendezvous(gen, seq, "10.0.0.1", 1234)
        assert await board.get_rendezvous(gen, seq) == ("10.0.0.1", 1234)
        await board.report(gen, seq, 1, True, b"")
        assert await board.wait(seq, 0.05) == (PENDING, None)  # rank 0 not done yet
        await board.report(gen, seq, 0, True, b"value")
        assert await board.wait(seq, 1) == ("ok", b"value")

    run(main())


def test_the_first_error_wins_and_stops_the_job_everywhere() -> None:
    async def main() -> None:
        board = JobBoard(keep_warm_s=60)
        gen = await board.new_generation(2)
        seq = await board.submit(b"job")
        assert await board.job_active(gen, seq)
        await board.report(gen, seq, 1, False, b"boom")
        await board.report(gen, seq, 0, False, b"later")
        assert not await board.job_active(gen, seq)
        assert await board.wait(seq, 1) == ("error", (1, b"boom"))

    run(main())


def test_a_replaced_group_reruns_the_job_and_old_outcomes_are_ignored() -> None:
    async def main() -> None:
        board = JobBoard(keep_warm_s=60)
        old = await board.new_generation(2)
        seq = await board.submit(b"job")
        await board.report(old, seq, 1, True, b"")
        new = await board.new_generation(2)  # Ray Train replaced the group
        assert new == old + 1
        assert await board.next_job(old, 0) is None  # the old group's workers end
        assert await board.next_job(new, 0) == (seq, b"job", None)  # the new group runs it again
        await board.report(old, seq, 0, True, b"stale")
        assert await board.wait(seq, 0.05) == (PENDING, None)
        await board.report(new, seq, 0, True, b"fresh")
        await board.report(new, seq, 1, True, b"")
        assert await board.wait(seq, 1) == ("ok", b"fresh")

    run(main())


def test_idle_workers_are_let_go_after_keep_warm() -> None:
    async def main() -> None:
        board = JobBoard(keep_warm_s=0.2)
        gen = await board.new_generation(1)
        assert await asyncio.wait_for(board.next_job(gen, 0), 5) is None
        assert board.stopped

    run(main())


def test_stop_ends_waiting_workers_and_refuses_new_jobs() -> None:
    async def main() -> None:
        board = JobBoard(keep_warm_s=60)
        gen = await board.new_generation(1)
        waiting = asyncio.ensure_future(board.next_job(gen, 0))
        await asyncio.sleep(0.05)
        await board.stop()
        assert await asyncio.wait_for(waiting, 5) is None
        try:
            await board.submit(b"job")
        except RuntimeError as e:
            assert "ended" in str(e)
        else:
            raise AssertionError("a stopped board took a job")

    run(main())


def test_stop_ends_a_driver_waiting_on_a_job() -> None:
    # The driver's wait must return when the run ends under a job (before a
    # disconnect), not poll on until the job finishes.
    async def main() -> None:
        board = JobBoard(keep_warm_s=60)
        gen = await board.new_generation(1)
        await board.register(gen, 0, "actor0")
        seq = await board.submit(b"job")
        waiting = asyncio.ensure_future(board.wait(seq, 30))
        await asyncio.sleep(0.05)
        await board.stop()
        assert await asyncio.wait_for(waiting, 5) == ("error", (-1, b""))

    run(main())


def test_a_cancelled_job_stops_everywhere_and_the_workers_take_the_next() -> None:
    async def main() -> None:
        board = JobBoard(keep_warm_s=60)
        gen = await board.new_generation(2)
        seq = await board.submit(b"long")
        assert await board.next_job(gen, 0) == (seq, b"long", None)
        waiter = asyncio.ensure_future(board.get_rendezvous(gen, seq))  # rank 1, before rank 0 published
        await board.cancel(seq)
        assert not await board.job_active(gen, seq)  # each rank kills its copy
        assert await asyncio.wait_for(waiter, 1) is None  # rank 1 stops waiting for rank 0
        nxt = await board.submit(b"next")
        assert await board.next_job(gen, seq) == (nxt, b"next", None)
        await board.cancel(seq)  # too late: nothing happens to the next job
        assert await board.job_active(gen, nxt)

    run(main())


def test_a_new_keep_warm_counts_from_now() -> None:
    async def main() -> None:
        board = JobBoard(keep_warm_s=60)
        gen = await board.new_generation(1)
        await board.set_keep_warm(0.2)
        assert await asyncio.wait_for(board.next_job(gen, 0), 2) is None  # idle 0.2 s: the run ends
        assert board.stopped

    run(main())
