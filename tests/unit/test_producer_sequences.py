"""The idempotent producer's answer to OUT_OF_ORDER_SEQUENCE with several batches in flight per
partition (client/inflight.py ``_answered``): retried when an earlier batch of the partition was
answered after it went out (the broker saw it first: the earlier one went through the router while
the partition was being adopted, or was refused and resent), failed for good when nothing was."""

from __future__ import annotations

import time

from tailrace.client import protocol as P
from tailrace.client.inflight import _InFlight
from tailrace.client.producer import ProducerCore
from tailrace.client.records import encode_batch

TP = ("t", 0)


class _Routes:
    def answered(self, topic, partition, via, code) -> None:
        pass


class _Reply:
    def __init__(self, code: int):
        self.code = code

    def raise_for_code(self):
        from tailrace.client.errors import error_for
        raise error_for(self.code, "OUT_OF_ORDER_SEQUENCE: this partition expects 0")


def _sent(core: ProducerCore, seq: int) -> _InFlight:
    frame = encode_batch([b"x"] * 1000, producer_id=core.producer_id, base_sequence=seq)
    now = time.monotonic()
    b = _InFlight(TP[0], TP[1], frame, 1000, now, now, gaps=core._gaps.get(TP, 0))
    core._inflight_per[TP] = core._inflight_per.get(TP, 0) + 1
    core._buffered_bytes += len(frame)
    return b


def _core() -> ProducerCore:
    core = ProducerCore(acks="memory", max_in_flight_per_partition=4)
    core.routes = _Routes()
    return core


def test_out_of_order_after_the_earlier_batch_was_stored_is_retried():
    core = _core()
    first, second = _sent(core, 0), _sent(core, 1000)
    ok = P.ProduceReply(base_offset=0, record_count=1000, append_time_us=0)
    core._answered(first, None, P.ErrorCode.OK, ok, None)  # read first, though the broker saw `second` first
    core._answered(second, None, P.ErrorCode.OUT_OF_ORDER_SEQUENCE, None, _Reply(P.ErrorCode.OUT_OF_ORDER_SEQUENCE))
    assert not core.errors and list(core._retry[TP]) == [second]


def test_out_of_order_with_nothing_answered_since_it_went_out_fails_for_good():
    core = _core()
    lone = _sent(core, 5000)  # a real gap: no batch before it in flight, none answered meanwhile
    core._answered(lone, None, P.ErrorCode.OUT_OF_ORDER_SEQUENCE, None, _Reply(P.ErrorCode.OUT_OF_ORDER_SEQUENCE))
    assert len(core.errors) == 1 and not core._retry.get(TP)


def test_out_of_order_while_an_earlier_batch_is_in_flight_is_retried_in_sequence_order():
    core = _core()
    first, second, third = _sent(core, 0), _sent(core, 1000), _sent(core, 2000)
    for b in (third, second):
        core._answered(b, None, P.ErrorCode.OUT_OF_ORDER_SEQUENCE, None, _Reply(P.ErrorCode.OUT_OF_ORDER_SEQUENCE))
    assert not core.errors and list(core._retry[TP]) == [second, third]
