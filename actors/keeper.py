"""What a worker's rings hold in memory, and giving back what is cold (docs/DESIGN.md "Rings
that give their pages back").

A ring is a sparse file in /dev/shm: making one costs nothing, a page costs memory once written,
and ``RingWriter.release`` (shm/ring.py) punches the pages of flushed batches out again. JMQ4
keeps its read cache as pages shared by every partition, hot kept and cold evicted; here every
ring is its own window onto one pool, the tmpfs, and the keeper decides what each keeps:

- **idle**: a ring not appended to for ``ring_idle_ms`` gives back every flushed page (its
  newest, partly written page stays). A broker of 10,000 partitions of which 100 are busy holds
  100 rings' worth of memory, not 10,000.
- **pressure**: once the worker's rings hold more than ``HIGH`` of its share of the budget
  (``shm_budget_bytes / workers``), they give back, coldest first (the least recently appended
  to), down to ``LOW``: first what is older than the newest ``ring_warm_bytes`` of each (the
  warm tail that readers just behind the head read from memory), then the rest.
- **full**: at the share, the rings may not take new pages (``Growth.allowed``): an append that
  would write on a page given back or never written is answered BACKPRESSURE (retriable, as a
  full ring's) until the flusher has written enough to give back. Bytes the flusher has not
  written are never given back, so only a flusher far behind reaches this.

Costs follow activity: the estimate is updated for the rings a turn appended to, the
least-recently-used order is an ``OrderedDict`` moved on append, an idle ring leaves it once it
has given back, and one tick gives back at most ``MAX_RELEASES`` rings (a worker's loop never
stalls on 10,000 punches at once).
"""

from __future__ import annotations

from collections import OrderedDict

from tailrace.shm.ring import Growth, RingWriter

HIGH, LOW = 0.75, 0.5  # of the worker's share: give back above HIGH, down to LOW
TICK_S = 0.25  # how often idle rings are looked for
PRESSED_TICK_S = 0.02  # ... and how often while over HIGH
MAX_RELEASES = 256  # rings given back per tick at most


class RingKeeper:
    """The pages of one worker's rings: an estimate of what they hold (``total``), the rings in
    least-recently-appended order, and the idle and pressure policies above."""

    def __init__(self, share_bytes: int, idle_s: float, warm_bytes: int, crash=None):
        self.share, self.idle_s, self.warm = share_bytes, idle_s, warm_bytes
        self.crash = crash  # fault injection (debug_crash_at): called with a step name at each kill point
        self.growth = Growth()  # shared by every writer of this worker
        self.held: dict[int, int] = {}  # slot -> resident bytes (RingWriter.resident_bytes, when last looked)
        self.total = 0
        self.recent: OrderedDict[int, float] = OrderedDict()  # slot -> last append (monotonic), oldest first
        self.next_tick = 0.0
        self.released_bytes = 0  # given back so far (a counter, for the metrics)

    def add(self, slot: int, writer: RingWriter, now: float) -> None:
        """A ring adopted here: its writer takes the worker's ``Growth``; held as it says."""
        writer.growth = self.growth
        self._set(slot, writer.resident_bytes())
        self.recent[slot] = now
        self.recent.move_to_end(slot)

    def forget(self, slot: int) -> None:
        self.total -= self.held.pop(slot, 0)
        self.recent.pop(slot, None)
        self.growth.allowed = self.total < self.share

    def appended(self, actors: dict, slots, now: float) -> None:
        """After a turn: the rings appended to hold more, and are the most recent."""
        recent, held = self.recent, self.held
        for slot in slots:
            actor = actors.get(slot)
            if actor is None:
                continue
            n = actor.writer.resident_bytes()
            self.total += n - held.get(slot, 0)
            held[slot] = n
            recent[slot] = now
            recent.move_to_end(slot)
        if self.total >= self.share:
            self.growth.allowed = False

    def tick(self, actors: dict, now: float) -> None:
        """Give back what is idle, and what is over the share's HIGH mark (at most
        MAX_RELEASES rings a call; it is called every loop turn and acts every TICK_S)."""
        if now < self.next_tick:
            return
        left = MAX_RELEASES
        cutoff = now - self.idle_s
        for slot, last in list(self.recent.items()):  # oldest first: stop at the first recent one
            if last > cutoff or left == 0:
                break
            left -= 1
            actor = actors.get(slot)
            if actor is None:
                self.forget(slot)
                continue
            self._release(slot, actor.writer, 0)
            row = actor.writer.row
            if row.flushed_position >= row.write_position:  # all given back it can: out of the order
                del self.recent[slot]
            else:  # unflushed bytes stay: look again next tick, after the newer ones
                self.recent.move_to_end(slot)
        if self.total > self.share * HIGH:
            target = self.share * LOW
            for keep in (self.warm, 0):  # cold bytes of every ring first, then the warm tails
                for slot in list(self.recent):
                    if self.total <= target or left == 0:
                        break
                    actor = actors.get(slot)
                    if actor is not None:
                        left -= 1
                        self._release(slot, actor.writer, keep)
        self.growth.allowed = self.total < self.share
        self.next_tick = now + (PRESSED_TICK_S if self.total > self.share * HIGH else TICK_S)

    def _release(self, slot: int, writer: RingWriter, keep: int) -> None:
        if writer.fenced:  # another owner writes it now: not ours to touch
            return
        crash = self.crash
        freed = writer.release(keep, None if crash is None else lambda: crash("ring_release_forgotten"))
        if crash is not None and freed:
            crash("ring_release_punched")
        if freed:
            self.released_bytes += freed
            self._set(slot, writer.resident_bytes())

    def _set(self, slot: int, n: int) -> None:
        self.total += n - self.held.get(slot, 0)
        self.held[slot] = n
