"""Cutting one partition's log back to an offset on a running broker: the owning actor's side.

A cluster follower whose log diverged from its new leader's (Kafka's leader-epoch truncation,
KIP-101/279) must cut its copy back to an offset T, a batch boundary at or below its log end,
then append the leader's batches from T on. ``truncate(actor, T)`` is called on the worker's
loop thread for an actor it owns (actors/produce.py ``replica_append``, when the router's
REPLICA_APPEND carries ``truncate_to``); it never blocks: it returns -1 while the cut is in
progress and the caller asks again later (at its next request), else the log end after the cut.

Who does what (the handshake is two words of the partition's control-table row, shm/layout.py:
``truncate_request`` in the owner's line 1, ``truncated_to`` in the flusher's line 2):

1. The actor waits until the flusher has copied out every descriptor (``flushed_desc ==
   desc_head``) and answered every durable waiter past T (they are answered by the sync that
   follows, truthfully: the bytes were synced then), then stores ``truncate_request = T + 1``.
   From here its appends are refused (NOT_READY) until the cut is done.
2. The flusher makes the cut durable (a marker in ``journal/truncations.json``), cuts the index
   file, resets its own per-slot words (``flushed_offset = T``, ``durable_offset`` at most T),
   checkpoints and acknowledges in ``truncated_to`` (persistence/truncation.py).
3. On a later call the actor sees the acknowledgement and empties its ring window at T: first
   ``desc_tail = desc_head`` (every ring read in flight is thrown away: same-host readers keep a
   copy only if the tail did not pass it, client/ring_reader.py), then ``ring_start_offset``
   and ``next_offset`` = T, then it clears its request; it forgets the producer state of the cut
   batches and reloads the running max time from the new last batch. The write position stays:
   the ring goes on where it was, and the flusher stages from ``flushed_desc == desc_head``.
4. The flusher, seeing the request gone, clears its acknowledgement; only then may a new cut be
   asked (a request stored while an old acknowledgement is still there would read as done).

Why it is crash-safe: the marker is the cut. Before it is durable nothing on disk changed and the
old log is recovered whole (the request is still in shared memory for a restarted flusher, or
gone with a host crash: the follower asks again); after it, recovery skips the cut batches
whatever else was done. A worker that dies between 3's stores leaves a request and its
acknowledgement: the next owner finishes the reset at takeover (``resume``, from
``PartitionActor._take_over``), and appends finish it too, so a partition is never left refusing.

Readers: until the call returns T, the old tail may still be read from the ring; from the
flusher's reset on, nothing of it is read from disk (``flushed_offset`` is T) and nothing at or
past T is durable until the new batches are synced. Not covered: a cold read the worker's
disk-reader thread had already read before the cut may still be answered after it (a
follower's partition serves no client fetch; only reads in flight when a leader became a
follower are concerned).
"""

from __future__ import annotations

import logging

from . import epochs

log = logging.getLogger("tailrace.partition")


def cut_target(actor, to: int, epoch: int) -> int:
    """Where a follower's copy is cut (REPLICA_APPEND ``truncate_to``, ``truncate_epoch``): ``to``,
    or where the copy's own batches of ``epoch`` (or earlier) end if that is lower (Kafka's
    KIP-279: the leader said where that epoch ends in its log, the copy may end it sooner;
    actors/epochs.py, a binary search over the log's batch headers). ``epoch`` -1: ``to``.
    Raises OSError when a batch header cannot be read."""
    if epoch < 0:
        return to
    return min(to, epochs.end_of_epoch(actor, epoch)[1])


def truncate(actor, target: int) -> int:
    """Cut ``actor``'s log back to ``target`` (to the base offset of the batch holding it).

    Returns -1 while the cut is in progress (or the actor cannot act yet: a previous owner still
    holds the partition, or this one was fenced: see ``actor.writer.fenced``): call again later,
    with the same target (the caller should kick the flusher: the cut waits for it to copy out
    and sync). Otherwise returns the log end after the cut: ``next_offset`` at once when
    ``target`` is at or past it (nothing to cut; a cut already asked is finished first), else the
    offset cut to. Raises ValueError when ``target`` (or the base of its batch) is below the log
    start, or the partition is led here (a leader's log is never cut). Idempotent: a call after
    the cut returns the end."""
    if not actor.check_ownership():
        return -1
    row = actor.owner_row
    if row.truncate_request and not resume(actor):
        return -1  # the flusher has not made it yet
    end = row.next_offset
    if target >= end:
        return end
    if actor.repl is not None:
        raise ValueError(f"partition slot {actor.slot} is led here: a leader's log is never cut")
    base = batch_base(actor, target)
    start = row.log_start_offset
    if base < start:
        raise ValueError(f"offset {target} (its batch starts at {base}) is below the log start {start}")
    if row.io_error:
        return -1  # the flusher cannot write: its successor makes the cut once the journal takes writes
    if row.truncated_to:
        return -1  # the last cut's acknowledgement is still up: a request now would read as done at once
    if row.flushed_desc != row.desc_head:
        return -1  # the flusher has not copied everything out yet (the caller kicks it)
    q = actor.durable_waiters
    if q and q[-1][0] > base:
        return -1  # answered by the sync that follows; after the cut their offsets would mean other batches
    row.truncate_request = base + 1
    log.info("slot %d: cut back to offset %d asked (log end %d)", actor.slot, base, end)
    return -1


def batch_base(actor, offset: int) -> int:
    """The base offset of the batch holding ``offset`` (below the log end): from the ring's
    descriptors, or below the ring from the dense index (its entry's ``rel``)."""
    row, ring = actor.owner_row, actor.ring
    tail, head = row.desc_tail, row.desc_head
    if offset >= row.ring_start_offset and tail < head:
        seq = ring.find_seq(tail, head, offset)
        if seq >= tail:
            return int(ring.descriptors(seq, seq + 1)["base_offset"][0])
    e = actor.log.index().read(offset, 1)
    if not len(e):
        raise ValueError(f"offset {offset} is not in the index of slot {actor.slot}")
    return offset - int(e["rel"][0])


def resume(actor) -> bool:
    """Finish a cut the flusher has acknowledged: empty the ring window at the offset cut to,
    clear the request, forget the cut batches' producer state and reload the max time. True when
    no cut is pending any more; False while the flusher has not acknowledged one (appends wait)."""
    row = actor.owner_row
    if not row.truncate_request:
        return True
    done = row.truncated_to
    if not done:
        return False
    to = done - 1  # where the flusher cut: the request's offset, or the log start if retention passed it
    row.desc_tail = row.desc_head  # first: any ring read that copied the old tail is thrown away
    row.ring_start_offset = to
    row.next_offset = to
    row.truncate_request = 0  # last: a worker dying before this finishes the reset at takeover
    actor.producers.truncate(to)
    actor.max_time_us = 0
    actor._load_max_time()
    log.info("slot %d: log cut back to offset %d", actor.slot, to)
    return True
