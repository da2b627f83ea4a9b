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


# below these a slot's decayed figures count as zero and it leaves the model (a byte a second,
# a thousandth of a held request): an idle partition costs a beat nothing
RATE_FLOOR, HELD_FLOOR = 1.0, 1e-3


class LoadModel:
    """Only partitions with load are kept (``rate``/``held`` hold the others as absent, zero):
    a beat updates the worker's slots with load or with something to report, not all it owns,
    so 10,000 idle partitions cost the router nothing a heartbeat."""

    def __init__(self):
        self.rate: dict[int, float] = {}  # slot -> decayed append rate, bytes/s
        self.held: dict[int, float] = {}  # slot -> decayed count of requests its owner holds
        self.busy: set[int] = set()  # slots whose owner held requests for them at its last beat

    def beat(self, slots: list[int], dt_s: float, appended: dict[int, int], busy, held: dict[int, int]) -> float:
        """One heartbeat of a worker that owns ``slots``: ``appended`` bytes per slot since its last
        beat ``dt_s`` ago, the slots it holds requests for (``busy``) and how many (``held``).
        Returns the worker's load (the sum of its slots' loads)."""
        mine = set(slots)
        return self._beat(mine.__contains__, dt_s, appended, busy, held)

    def beat_owned(self, owner: dict[int, int], worker: int, dt_s: float, appended: dict[int, int], busy,
                   held: dict[int, int]) -> float:
        """``beat`` of ``worker``, its slots those ``owner`` (slot -> worker) gives it: looks only
        at the slots with load or named in the beat."""
        return self._beat(lambda slot: owner.get(slot) == worker, dt_s, appended, busy, held)

    def _beat(self, is_mine, dt_s: float, appended: dict[int, int], busy, held: dict[int, int]) -> float:
        dt_s = max(dt_s, MIN_BEAT_S)
        rate, kept = self.rate, self.held
        look = [slot for slot in {*rate, *kept, *appended, *held} if is_mine(slot)]
        total = 0.0
        for slot in look:
            r = RATE_KEEP * rate.get(slot, 0.0) + (1 - RATE_KEEP) * appended.get(slot, 0) / dt_s
            h = HELD_DECAY * kept.get(slot, 0.0) + (1 - HELD_DECAY) * held.get(slot, 0)
            if r < RATE_FLOOR and h < HELD_FLOOR:
                rate.pop(slot, None)
                kept.pop(slot, None)
                continue
            rate[slot], kept[slot] = r, h
            total += h + r / RATE_UNIT
        self.busy = {slot for slot in self.busy if not is_mine(slot)} | {slot for slot in busy if is_mine(slot)}
        return total

    def slot_load(self, slot: int) -> float:
        """A partition's load: requests held (decayed) + its decayed append rate in MiB/s."""
        return self.held.get(slot, 0.0) + self.rate.get(slot, 0.0) / RATE_UNIT

    def loads(self) -> dict[int, float]:
        """The load of every partition that has any (the others: zero)."""
        return {slot: self.slot_load(slot) for slot in {*self.rate, *self.held}}
