"""router/call_slots.py: the call slots that tell a hung shard from a busy one."""

import threading
import time

import pytest

from router.call_slots import CallSlots


def wait_until(cond, what, timeout=30):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_slots_are_taken_given_back_and_never_over_released():
    s = CallSlots(2, hung_after=60)
    assert s.acquire(0) and s.acquire(0) and s.in_use == 2
    assert not s.acquire(0)  # none free and no time to wait
    s.release()
    s.release()
    assert s.in_use == 0
    with pytest.raises(ValueError):
        s.release()
    with pytest.raises(ValueError):
        CallSlots(0, 1)


def test_a_waiter_gets_the_next_slot_first_come_first_served():
    s = CallSlots(1, hung_after=60)
    assert s.acquire(0)
    order = []

    def wait_for_slot(name):
        assert s.acquire(60)
        order.append(name)

    first = threading.Thread(target=wait_for_slot, args=("first",))
    first.start()
    wait_until(lambda: len(s._waiters) == 1, "first waiter queued")
    second = threading.Thread(target=wait_for_slot, args=("second",))
    second.start()
    wait_until(lambda: len(s._waiters) == 2, "second waiter queued")
    s.release()  # handed to the first waiter, not to whoever takes the lock first
    wait_until(lambda: order == ["first"], "first served")
    assert not s.acquire(0)  # the handed-over slot is taken
    s.release()
    wait_until(lambda: order == ["first", "second"], "second served")
    s.release()
    assert s.in_use == 0


def test_a_hung_shard_is_refused_and_a_busy_one_is_waited_for():
    s = CallSlots(2, hung_after=0.3)
    assert s.acquire(0) and s.acquire(0)
    assert not s.hung()  # just filled up: a burst after a long idle time is not a hang
    waiter = []
    t = threading.Thread(target=lambda: waiter.append(s.acquire(60)))
    t.start()
    t.join(30)  # no answer for 0.3 s: the waiter gives up long before its 60 s
    assert waiter == [False] and s.hung()
    started = time.monotonic()
    assert not s.acquire(60)  # hung: refused at once
    assert time.monotonic() - started < 10
    s.release(answered=True)  # an answer: not hung any more, and a slot is free
    assert not s.hung() and s.acquire(0)
    s.release(answered=False)
    s.release(answered=False)


def test_a_steady_shard_keeps_its_waiters_however_long_the_queue():
    s = CallSlots(1, hung_after=0.5)
    got = []

    def call():
        if s.acquire(60):
            time.sleep(0.1)  # every call is answered within 0.1 s
            s.release(answered=True)
            got.append(True)
        else:
            got.append(False)

    threads = [threading.Thread(target=call) for _ in range(12)]  # 1.2 s of queue
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == [True] * 12 and s.in_use == 0
