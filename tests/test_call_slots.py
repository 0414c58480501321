"""router/call_slots.py: the counting semaphore behind the router's per-shard call slots."""

import threading
import time

import pytest

from router.call_slots import CallSlots


def test_slots_run_out_and_come_back():
    s = CallSlots(2)
    assert s.acquire(0) and s.acquire(0) and s.in_use == 2
    started = time.monotonic()
    assert not s.acquire(0.05)  # none free: refused after the wait
    assert time.monotonic() - started >= 0.04
    s.release()
    assert s.acquire(0) and s.in_use == 2
    s.release()
    s.release()
    assert s.in_use == 0
    with pytest.raises(ValueError):
        s.release()
    with pytest.raises(ValueError):
        CallSlots(0)


def test_a_release_wakes_a_waiter():
    s = CallSlots(1)
    assert s.acquire(0)
    got = []
    waiter = threading.Thread(target=lambda: got.append(s.acquire(60)))
    waiter.start()
    deadline = time.monotonic() + 30
    while s._waiting == 0:  # the waiter is waiting
        assert time.monotonic() < deadline
        time.sleep(0.01)
    s.release()
    waiter.join(30)
    assert got == [True] and s.in_use == 1


def test_many_threads_never_hold_more_than_the_slots():
    s = CallSlots(3)
    held, peak, lock = [0], [0], threading.Lock()

    def work():
        for _ in range(200):
            if s.acquire(5):
                with lock:
                    held[0] += 1
                    peak[0] = max(peak[0], held[0])
                with lock:
                    held[0] -= 1
                s.release()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert peak[0] <= 3 and held[0] == 0 and s.in_use == 0
