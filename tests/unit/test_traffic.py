"""router/traffic.py: the broker's totals survive worker restarts and retirements; rates come
from the samples of the last window."""

from tailrace.router.traffic import RATE_WINDOW_S, Traffic


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_totals_add_up_across_workers_restarts_and_retirement():
    tr = Traffic(Clock())
    tr.on_heartbeat(0, boot_ns=1, totals=[10, 1000, 5, 500], unflushed=3)
    tr.on_heartbeat(1, boot_ns=7, totals=[1, 100, 0, 0], unflushed=2)
    assert tr.totals() == [11, 1100, 5, 500] and tr.unflushed() == 5
    tr.on_heartbeat(0, boot_ns=1, totals=[20, 2000, 5, 500], unflushed=0)  # the same life, further on
    assert tr.totals() == [21, 2100, 5, 500]
    tr.on_heartbeat(0, boot_ns=2, totals=[1, 10, 0, 0], unflushed=0)  # restarted: counts from zero again
    assert tr.totals() == [22, 2110, 5, 500]
    tr.forget(1)
    assert tr.totals() == [22, 2110, 5, 500] and tr.unflushed() == 0
    tr.on_heartbeat(2, boot_ns=1, totals=[1, 2], unflushed=0)  # a worker that reports no totals is ignored
    assert tr.totals() == [22, 2110, 5, 500]


def test_rates_over_the_window():
    clock = Clock()
    tr = Traffic(clock)
    assert tr.rates()["records_in"] == 0.0
    for i in range(40):  # 0.5 s heartbeats, 1,000 records and 1 MB in per heartbeat
        tr.on_heartbeat(0, boot_ns=1, totals=[1000 * i, 1_000_000 * i, 0, 0], unflushed=0)
        tr.sample()
        clock.t += 0.5
    r = tr.rates()
    assert r["records_in"] == 2000.0 and r["bytes_in"] == 2_000_000.0 and r["records_out"] == 0.0
    assert tr.samples[-1][0] - tr.samples[0][0] <= RATE_WINDOW_S + 0.5
