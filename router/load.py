"""The load model: what each partition costs its worker, from the workers' heartbeats.

Pure: no I/O, no clock (the time between two beats is passed in), so it is unit-tested like the
scheduler's heap (tests/unit/test_load_model.py). The router feeds it every heartbeat and reads
``slot_load`` for the Rebalancer and ``worker_load`` for the scheduler's traffic figure.

A partition's load is the requests its owner holds for it (parked fetches + durable waiters),
decayed with a half-life of four beats, plus its append rate in MiB/s, decayed with a half-life
of one beat. Decay, not snapshots: one heartbeat's snapshot flickers (a tailing consumer's fetch
is parked at one beat and in flight at the next), and load built on snapshots moved partitions of
an evenly loaded broker.
"""

from __future__ import annotations

RATE_UNIT = float(1 << 20)  # one unit of load per MiB/s appended
RATE_KEEP = 0.5  # per beat: rate half-life one beat
HELD_DECAY = 0.5 ** (1 / 4)  # per beat: held requests half-life four beats
MIN_BEAT_S = 0.1  # a beat closer than this to the last counts as this far (no rate spikes)


class LoadModel:
    def __init__(self):
        self.rate: dict[int, float] = {}  # slot -> decayed append rate, bytes/s
        self.held: dict[int, float] = {}  # slot -> decayed count of requests its owner holds
        self.busy: set[int] = set()  # slots whose owner held requests for them at its last beat

    def beat(self, slots: list[int], dt_s: float, appended: dict[int, int], busy, held: dict[int, int]) -> float:
        """One heartbeat of a worker that owns ``slots``: ``appended`` bytes per slot since its last
        beat ``dt_s`` ago, the slots it holds requests for (``busy``) and how many (``held``).
        Returns the worker's load (the sum of its slots' loads)."""
        dt_s = max(dt_s, MIN_BEAT_S)
        mine = set(slots)
        for slot in mine:
            self.rate[slot] = RATE_KEEP * self.rate.get(slot, 0.0) + (1 - RATE_KEEP) * appended.get(slot, 0) / dt_s
            self.held[slot] = HELD_DECAY * self.held.get(slot, 0.0) + (1 - HELD_DECAY) * held.get(slot, 0)
        self.busy = (self.busy - mine) | (set(busy) & mine)
        return sum(self.slot_load(slot) for slot in mine)

    def slot_load(self, slot: int) -> float:
        """A partition's load: requests held (decayed) + its decayed append rate in MiB/s."""
        return self.held.get(slot, 0.0) + self.rate.get(slot, 0.0) / RATE_UNIT
