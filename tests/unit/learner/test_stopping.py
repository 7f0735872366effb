"""A stop never cuts a swap short: it waits for the swap to end, unless asked twice."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from learner.stopping import GracefulStop


def test_a_stop_outside_a_swap_may_happen_at_once() -> None:
    stopping = GracefulStop()
    assert not stopping.requested
    assert stopping.request()
    assert stopping.requested


def test_a_stop_during_a_swap_comes_when_the_swap_ends() -> None:
    stopping = GracefulStop()
    finished = []
    with pytest.raises(KeyboardInterrupt):
        with stopping.swap():
            assert not stopping.request()  # not now
            finished.append("swap")
    assert finished == ["swap"]


def test_nested_swaps_stop_after_the_outermost() -> None:
    stopping = GracefulStop()
    with pytest.raises(KeyboardInterrupt):
        with stopping.swap():
            with stopping.swap():
                stopping.request()
            # the inner one ended: the outer one goes on
            assert stopping.requested


def test_asked_twice_it_may_stop_now_even_mid_swap() -> None:
    stopping = GracefulStop()
    with pytest.raises(KeyboardInterrupt):
        with stopping.swap():
            assert not stopping.request()
            assert stopping.request()


def test_a_swap_that_fails_raises_its_own_error_not_the_stop() -> None:
    stopping = GracefulStop()
    with pytest.raises(ValueError):
        with stopping.swap():
            stopping.request()
            raise ValueError("vLLM went away")


def test_a_swap_with_no_stop_asked_ends_quietly() -> None:
    stopping = GracefulStop()
    with stopping.swap():
        pass
    assert not stopping.requested


def test_wait_ends_early_once_a_stop_is_requested() -> None:
    stopping = GracefulStop()
    threading.Timer(0.05, stopping.request).start()
    started = time.monotonic()
    stopping.wait(30)
    assert time.monotonic() - started < 10


def test_sigterm_during_a_swap_is_deferred_and_outside_it_is_immediate() -> None:
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    stopping = GracefulStop()
    try:
        stopping.install()
        reached = []
        with pytest.raises(KeyboardInterrupt):
            with stopping.swap():
                signal.raise_signal(signal.SIGTERM)  # its handler runs before this returns
                reached.append("after the signal, still in the swap")
        assert reached == ["after the signal, still in the swap"]

        again = GracefulStop()
        again.install()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
            reached.append("not reached: outside a swap the handler raises at once")
        assert reached == ["after the signal, still in the swap"]
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
