"""The metrics exporter: one Prometheus endpoint for the whole broker (``--metrics-bind``).

A supervisord program of its own (``python -m tailrace.ops.metrics``), so a scrape never takes
a cycle from the router, a worker or the flusher. At each scrape it reads:

- the control table (shared memory, read-only): per partition the watermarks, the log start,
  the bytes appended, the ring bytes not yet written; the flusher's heartbeat;
- the catalog: topic names, partitions and ring sizes, the shared-memory budget used;
- each process's own counters (broker/stats.py snapshots in the run directory): per worker the
  requests by op and code, request durations, records and bytes fetched per partition; the
  flusher's cycles, bytes written, write and fsync durations; the router's view of the workers
  (heartbeat age, partitions, load, restarts) and the connected clients;
- the journal directory: segments and their disk use;
- consumer lag: the router's group coordinator reports every group's committed offsets (its own
  snapshot, ``groups``); lag in records is the partition's high watermark minus the committed
  offset, lag in seconds is how long ago the first record not yet consumed was appended (every
  batch carries its append time: read from the ring as a same-host consumer reads it, or from the
  index and the journal as a seek by time does; 0 for a group that is caught up).

Everything is exposed through prometheus_client (a custom collector of metric families; the
library writes the text format). Counters of a restarted process continue from where the last
snapshot of its previous life left them (``Lives``), so no counter goes backwards while the
exporter lives; a restart of the exporter or of the whole broker is an ordinary counter reset.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from tailrace.broker import datadir, stats
from tailrace.broker import settings as settings_mod
from tailrace.broker.catalog import Catalog
from tailrace.client import protocol as P
from tailrace.client.records import STAMP, STAMP_AT
from tailrace.client.ring_reader import SharedRings, TailStatus
from tailrace.persistence.index import IndexFile
from tailrace.persistence.journal import JournalReader
from tailrace.persistence.timesearch import batch_stamp
from tailrace.shm import layout
from tailrace.shm.layout import COL, ring_region_bytes
from tailrace.shm.ring import ControlTable

log = logging.getLogger("tailrace.metrics")

# Label names of every metric a process reports in its snapshot (broker/stats.py keys are the
# label values joined by "|", in this order), with the help text and the kind.
PROCESS_METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "worker_requests": ("counter", ("worker", "op", "code"), "Client requests a worker answered, by op and reply code (the router's heartbeats are not counted)."),
    "worker_request_duration_seconds": ("histogram", ("worker", "op"),
                                        "Time a worker spent on a request (service time; a durable ack's wait for the fsync is not in it)."),
    "partition_records_fetched": ("counter", ("topic", "partition"), "Records returned by fetches (same-host ring readers are not seen)."),
    "partition_bytes_fetched": ("counter", ("topic", "partition"), "Bytes of record batches returned by fetches."),
    "flusher_cycles": ("counter", (), "Flusher cycles that staged data for the journal."),
    "flusher_bytes_written": ("counter", (), "Bytes written to the journal (4 KiB-aligned writes, rewritten tail blocks included)."),
    "flusher_syncs": ("counter", (), "fdatasync calls on journal segments (group commits)."),
    "flusher_write_duration_seconds": ("histogram", (), "Duration of one aligned journal write."),
    "flusher_fsync_duration_seconds": ("histogram", (), "Duration of one group commit (fdatasync of the journal)."),
    "flusher_unsynced_bytes": ("gauge", (), "Bytes written to the journal and not yet fsynced."),
    "journal_segments_deleted": ("counter", (), "Journal segments deleted by retention (persistence/retention.py)."),
    "journal_bytes_deleted": ("counter", (), "Bytes of journal segments deleted by retention."),
    "journal_segments_forced": ("counter", (), "Journal segments the disk guard deleted inside retention (--disk-full-policy delete_oldest)."),
    "journal_records_forced": ("counter", (), "Records the disk guard deleted inside retention (--disk-full-policy delete_oldest)."),
    "storage_full": ("gauge", (), "1 while the journal's filesystem is fuller than --disk-max-used-ratio: produce is refused (STORAGE_FULL)."),
    "slots_retired": ("counter", (), "Partition slots of deleted topics the flusher cleared (free for new partitions)."),
    "journal_pinned_by": ("gauge", ("topic", "partition"), "1 for the partition whose oldest kept record keeps the oldest "
                                                           "journal segment: a long-retention topic pins segments for everyone."),
    "worker_restarts": ("counter", ("worker",), "Times a worker came back with a new boot id, as the router saw it."),
    "worker_heartbeat_age_seconds": ("gauge", ("worker",), "Seconds since the worker last answered the router's heartbeat."),
    "worker_partitions": ("gauge", ("worker",), "Partitions the scheduler places on the worker."),
    "ring_held_bytes": ("gauge", ("worker",), "Shared memory the worker's rings hold, as its keeper counts it (at most; actors/keeper.py)."),
    "ring_pages_given_back_bytes": ("counter", ("worker",), "Ring bytes the worker gave back (idle or over its share of the budget)."),
    "worker_load": ("gauge", ("worker",), "The worker's load as the scheduler sees it (held requests + MiB/s appended)."),
    "worker_up": ("gauge", ("worker",), "1 if the worker answers heartbeats."),
    "partition_owner_worker": ("gauge", ("topic", "partition"), "The worker that owns the partition."),
    "clients_connected": ("gauge", (), "Client connections to the router."),
    "replica_isr_size": ("gauge", ("topic", "partition"), "Cluster: in-sync replicas of a replicated partition this broker leads."),
    "replica_under_replicated": ("gauge", ("topic", "partition"),
                                 "Cluster: 1 if a replicated partition this broker leads has fewer in-sync replicas than replicas."),
    "replica_follower_lag_records": ("gauge", ("topic", "partition"),
                                     "Cluster: records this broker's copy of a partition it follows is behind the leader's high watermark."),
    "replica_follower_lag_seconds": ("gauge", ("topic", "partition"),
                                     "Cluster: seconds since this broker's copy of a partition it follows last reached the leader's high watermark."),
    "replica_leader_changes": ("counter", (), "Cluster: leader changes of partitions this broker holds a replica of, as its view saw them."),
    "group_committed_offset": ("gauge", ("topic", "partition", "group"), "The group's committed offset of the partition."),
    "share_in_flight": ("gauge", ("topic", "partition", "group"), "Share group: records read and not yet done "
                                                                   "(acquired, available again, or dead-letter pending)."),
    "share_acquired": ("gauge", ("topic", "partition", "group"), "Share group: records a member holds under a lock now."),
    "share_deliveries": ("counter", ("group",), "Share group: records handed to members (acquired), redeliveries included."),
    "share_redeliveries": ("counter", ("group",), "Share group: deliveries of records delivered before (released, lock ended)."),
    "share_dead_letters": ("counter", ("group",), "Share group: records written to its dead-letter topic, or archived when it has none."),
    "delayed_backlog_batches": ("gauge", (), "Delayed batches the timer holds, not yet due or being delivered (router/timer.py)."),
    "delayed_delivered_batches": ("counter", (), "Delayed batches the timer appended to their partitions."),
}
EXIT_NO_PORT = 2  # listed in supervisord.conf's exitcodes: not restarted in a loop


class Lives:
    """Counters across process restarts: a snapshot with a new boot id starts from zero, so the
    last values of the old life become a base added to the new ones."""

    def __init__(self):
        self.boot: dict[str, int] = {}
        self.last: dict[str, dict] = {}  # process -> {"counters": ..., "histograms": ...} last seen
        self.base: dict[str, dict] = {}  # process -> the same, summed over ended lives

    def see(self, snap: stats.Snapshot) -> tuple[dict, dict]:
        """Counters and histograms of ``snap``'s process, over all its lives seen."""
        p = snap.process
        if p in self.boot and self.boot[p] != snap.boot_ns:
            self.base[p] = _add(self.base.get(p, {}), self.last.get(p, {}))
        self.boot[p] = snap.boot_ns
        self.last[p] = {"counters": snap.counters, "histograms": snap.histograms}
        total = _add(self.base.get(p, {}), self.last[p])
        return total.get("counters", {}), total.get("histograms", {})


def _add(a: dict, b: dict) -> dict:
    """``a`` + ``b``, each {"counters": {name: {key: n}}, "histograms": {name: {key: h}}}."""
    out = {"counters": {}, "histograms": {}}
    for src in (a, b):
        merge(out["counters"], out["histograms"], src.get("counters", {}), src.get("histograms", {}))
    return out


def merge(counters: dict, histograms: dict, more_counters: dict, more_histograms: dict) -> None:
    """Add series into ``counters`` and ``histograms`` (same key: values and buckets summed)."""
    for name, series in more_counters.items():
        dst = counters.setdefault(name, {})
        for k, v in series.items():
            dst[k] = dst.get(k, 0) + v
    for name, series in more_histograms.items():
        dst = histograms.setdefault(name, {})
        for k, h in series.items():
            cur = dst.get(k)
            dst[k] = {"counts": list(h["counts"]), "sum": h["sum"]} if cur is None else \
                {"counts": [x + y for x, y in zip(cur["counts"], h["counts"])], "sum": cur["sum"] + h["sum"]}


class BrokerCollector:
    """prometheus_client collector: every metric family of the broker, read at each scrape."""

    def __init__(self, s: settings_mod.Settings):
        self.s = s
        self.run_dir = s.ipc_path()
        self.catalog = Catalog(s.data_dir)
        self.lives = Lives()
        self.append_times = AppendTimes(s)
        # prometheus_client serves scrapes on threads and calls collect() outside its own lock:
        # two at once would both see a process's new life and add the old one twice.
        self.lock = threading.Lock()

    def describe(self):
        return []  # collected at scrape time only (no registration-time scrape)

    def collect(self):
        with self.lock:
            families = list(self._collect())
        yield from families

    def _collect(self):
        t0 = time.perf_counter()
        self.catalog.reload()
        topics = self.catalog.data.topics
        by_slot = self.catalog.by_slot
        families, lag, hw_by_slot, by_slot = self._partitions(by_slot)
        yield from families
        gauges: dict[str, dict[str, float]] = {}
        yield from self._processes(by_slot, lag, gauges)
        yield from self._group_lag(by_slot, hw_by_slot, gauges.get("group_committed_offset", {}))
        yield from self._journal()
        g = GaugeMetricFamily("tailrace_topics", "Topics in the catalog.")
        g.add_metric([], len(topics))
        yield g
        g = GaugeMetricFamily("tailrace_partitions", "Partitions over all topics.")
        g.add_metric([], sum(t.partitions for t in topics.values()))
        yield g
        g = GaugeMetricFamily("tailrace_shm_used_bytes", "The topics' rings' full sizes (the most they could hold).")
        g.add_metric([], self.catalog.shm_bytes(ring_region_bytes))
        yield g
        g = GaugeMetricFamily("tailrace_shm_budget_bytes", "The shared-memory budget of all rings.")
        g.add_metric([], self.s.shm_budget_bytes)
        yield g
        g = GaugeMetricFamily("tailrace_scrape_duration_seconds", "Time this scrape took to collect.")
        g.add_metric([], time.perf_counter() - t0)
        yield g

    # --- the control table ----------------------------------------------------------------
    def _partitions(self, by_slot) -> tuple[list, tuple[int, int], dict[int, int], dict]:
        """The per-partition families, the (bytes, records) appended and not yet durable, the
        high watermark of every slot shown, and the slots shown (``by_slot``'s, at most
        ``metrics_partitions`` of them: the most bytes appended; per topic, every partition)."""
        out = []
        slots = np.array(sorted(s for s in by_slot), dtype=np.int64)
        try:
            table = ControlTable.attach(self.s.instance, read_only=True)
        except Exception:  # not there yet (the flusher is booting) or being replaced
            table = None
        try:
            rows = table.rows[slots[slots < table.max_slots]] if table is not None and len(slots) else None
            if table is not None:
                g = GaugeMetricFamily("tailrace_flusher_heartbeat_age_seconds", "Seconds since the flusher's last cycle.")
                beat = int(table.header["flusher_heartbeat_ns"])
                g.add_metric([], max(0.0, (time.monotonic_ns() - beat) / 1e9) if beat else float("nan"))
                out.append(g)
                g = GaugeMetricFamily("tailrace_broker_ready", "1 once the flusher has recovered the journal and published READY.")
                g.add_metric([], 1.0 if int(table.header["state"]) == layout.STATE_READY else 0.0)
                out.append(g)
            cols = {}
            if rows is not None:
                rows = rows.copy()  # one consistent-enough look, then no more reads of shared memory
        finally:
            if table is not None:
                table.close()
        lag_bytes = lag_records = 0
        if rows is not None:
            out.extend(_topic_families(rows, slots[: len(rows)], by_slot))
            lag_bytes = int((rows[:, COL["write_position"]] - rows[:, COL["flushed_position"]]).sum())
            lag_records = int((rows[:, COL["next_offset"]] - rows[:, COL["durable_offset"]]).sum())
            limit = self.s.metrics_partitions
            if 0 <= limit < len(rows):  # the busiest only: a scrape of 10,000 partitions stays small
                keep = np.sort(np.argsort(-rows[:, COL["write_position"]], kind="stable")[:limit])
                rows, slots = rows[keep], slots[keep]
                by_slot = {s: by_slot[s] for s in slots.tolist()}
            for name in ("next_offset", "durable_offset", "log_start_offset", "write_position", "flushed_position", "ring_bytes"):
                cols[name] = rows[:, COL[name]].tolist()
        labels = [[t.name, str(p)] for t, p in (by_slot[int(s)] for s in slots)]
        fams = {
            "records": CounterMetricFamily("tailrace_partition_records_appended", "Records appended (the high watermark: offsets start at 0).", labels=["topic", "partition"]),
            "bytes": CounterMetricFamily("tailrace_partition_bytes_appended", "Bytes of record batches appended to the ring since the broker's last full start (each padded to 8 bytes).", labels=["topic", "partition"]),
            "hw": GaugeMetricFamily("tailrace_partition_high_watermark", "Next offset to be assigned.", labels=["topic", "partition"]),
            "dw": GaugeMetricFamily("tailrace_partition_durable_watermark", "First offset not yet fsynced.", labels=["topic", "partition"]),
            "ls": GaugeMetricFamily("tailrace_partition_log_start_offset", "First offset kept.", labels=["topic", "partition"]),
            "ring": GaugeMetricFamily("tailrace_partition_ring_used_bytes", "Ring bytes not yet written to the journal (a full ring is backpressure).", labels=["topic", "partition"]),
            "cap": GaugeMetricFamily("tailrace_partition_ring_bytes", "Ring size.", labels=["topic", "partition"]),
            "lag": GaugeMetricFamily("tailrace_partition_durable_lag_records", "Records appended and not yet durable.", labels=["topic", "partition"]),
        }
        hw_by_slot = dict(zip(slots.tolist(), cols.get("next_offset", [])))
        if cols:
            for i, lv in enumerate(labels[: len(cols["next_offset"])]):
                hw, dw = cols["next_offset"][i], cols["durable_offset"][i]
                unflushed = cols["write_position"][i] - cols["flushed_position"][i]
                fams["records"].add_metric(lv, hw)
                fams["bytes"].add_metric(lv, cols["write_position"][i])
                fams["hw"].add_metric(lv, hw)
                fams["dw"].add_metric(lv, dw)
                fams["ls"].add_metric(lv, cols["log_start_offset"][i])
                fams["ring"].add_metric(lv, unflushed)
                fams["cap"].add_metric(lv, cols["ring_bytes"][i])
                fams["lag"].add_metric(lv, hw - dw)
        return out + list(fams.values()), (lag_bytes, lag_records), hw_by_slot, by_slot

    # --- each process's own counters -------------------------------------------------------
    def _processes(self, by_slot, lag: tuple[int, int], gauges: dict[str, dict[str, float]]):
        """Every process's counters (over its lives), gauges (into ``gauges``) and histograms,
        summed where two processes report the same series (a partition fetched on two workers
        after a move)."""
        counters: dict[str, dict[str, float]] = {}
        hists: dict[str, dict[str, dict]] = {}
        for snap in stats.read_all(self.run_dir):
            c, h = self.lives.see(snap)
            merge(counters, hists, c, h)
            merge(gauges, {}, snap.gauges, {})
        for name, (kind, labels, text) in PROCESS_METRICS.items():
            fam = _family(name, kind, labels, text)  # an empty family still tells a reader the metric exists
            if kind == "histogram":
                for key, h in hists.get(name, {}).items():
                    cum, buckets = 0, []
                    for bound, n in zip([*stats.LATENCY_BUCKETS, float("inf")], h["counts"]):
                        cum += n
                        buckets.append(("+Inf" if bound == float("inf") else repr(bound), cum))
                    lv = _labels(key, labels, by_slot)
                    if lv is not None:
                        fam.add_metric(lv, buckets, h["sum"])
            else:
                for key, value in (counters if kind == "counter" else gauges).get(name, {}).items():
                    lv = _labels(key, labels, by_slot)
                    if lv is not None:
                        fam.add_metric(lv, value)
            yield fam
        unsynced = sum(gauges.get("flusher_unsynced_bytes", {}).values())
        lag_bytes, lag_records = lag
        g = GaugeMetricFamily("tailrace_flusher_durable_lag_bytes", "Bytes appended and not yet durable (not yet written, or written and not yet fsynced).")
        g.add_metric([], lag_bytes + unsynced)
        yield g
        g = GaugeMetricFamily("tailrace_flusher_durable_lag_records", "Records appended and not yet durable, all partitions.")
        g.add_metric([], lag_records)
        yield g

    # --- consumer lag ----------------------------------------------------------------------
    def _group_lag(self, by_slot, hw_by_slot: dict[int, int], committed: dict[str, float]):
        """Lag per group and partition, in records and in seconds (the module docstring). One
        look-up of an append time per lagging partition and group, none for one caught up."""
        records = GaugeMetricFamily("tailrace_group_lag_records", "Records appended and not yet consumed by the group "
                                    "(high watermark minus committed offset).", labels=["group", "topic", "partition"])
        seconds = GaugeMetricFamily("tailrace_group_lag_seconds", "How long ago the group's first record not yet "
                                    "consumed was appended (0 when caught up).", labels=["group", "topic", "partition"])
        now_us = time.time_ns() // 1000
        for key, offset in sorted(committed.items()):
            slot_text, _, group = key.partition("|")
            found = by_slot.get(int(slot_text)) if slot_text.isdigit() else None
            if found is None or int(slot_text) not in hw_by_slot:
                continue
            (t, p), slot, offset = found, int(slot_text), int(offset)
            lag = max(0, hw_by_slot[slot] - offset)
            lv = [group, t.name, str(p)]
            records.add_metric(lv, lag)
            if lag == 0:
                seconds.add_metric(lv, 0.0)
                continue
            t_us = self.append_times.lookup(slot, t.topic_id, p, offset)
            if t_us is not None:
                seconds.add_metric(lv, max(0.0, (now_us - t_us) / 1e6))
        yield records
        yield seconds

    # --- the journal ----------------------------------------------------------------------
    def _journal(self):
        segments, disk = datadir.journal_usage(self.s.data_dir)
        g = GaugeMetricFamily("tailrace_journal_segments", "Journal segment files.")
        g.add_metric([], segments)
        yield g
        g = GaugeMetricFamily("tailrace_journal_bytes", "Disk the journal takes (allocated blocks).")
        g.add_metric([], disk)
        yield g


class AppendTimes:
    """The broker's append time of the batch holding an offset: from the partition's ring
    (mapped read-only, client/ring_reader.py), else, below the ring, from the dense index and the
    journal (persistence/timesearch.py ``batch_stamp``). None when neither has it (retention
    deleted it meanwhile, or the broker is restarting)."""

    def __init__(self, s: settings_mod.Settings):
        self.s = s
        self.rings: SharedRings | None = None

    def lookup(self, slot: int, topic_id: int, partition: int, offset: int) -> int | None:
        try:
            if self.rings is None or not self.rings.is_current():
                if self.rings is not None:
                    self.rings.close()
                self.rings = None
                self.rings = SharedRings(self.s.instance, 0)
            got = self.rings.partition(slot, topic_id, partition).read(offset, 1, 1)
            if got.status == TailStatus.DATA:
                return STAMP.unpack_from(got.body, STAMP_AT)[1]
        except Exception:  # noqa: BLE001 - no ring here now (the broker restarting): try the journal
            pass
        index = journal = None
        try:
            index = IndexFile(self.s.data_dir, slot)
            journal = JournalReader(self.s.data_dir, self.s.segment_bytes)
            return batch_stamp(index, journal, offset)[1]
        except OSError:
            return None
        finally:
            if journal is not None:
                journal.close()
            if index is not None:
                index.close()


def _topic_families(rows: np.ndarray, slots: np.ndarray, by_slot) -> list:
    """Per topic, summed over all its partitions (numpy, one pass): records and bytes appended,
    records not yet durable. Shown whatever ``metrics_partitions`` leaves out."""
    names = [by_slot[s][0].name for s in slots.tolist()]
    uniq, idx = np.unique(np.array(names, dtype=object), return_inverse=True) if names else ([], np.zeros(0, int))
    hw, dw, wp = (rows[:, COL[c]] for c in ("next_offset", "durable_offset", "write_position"))
    out = []
    for fam, values in ((CounterMetricFamily("tailrace_topic_records_appended", "Records appended, all partitions of the topic.",
                                             labels=["topic"]), hw),
                        (CounterMetricFamily("tailrace_topic_bytes_appended", "Bytes of record batches appended since the "
                                             "broker's last full start, all partitions of the topic.", labels=["topic"]), wp),
                        (GaugeMetricFamily("tailrace_topic_durable_lag_records", "Records appended and not yet durable, "
                                           "all partitions of the topic.", labels=["topic"]), hw - dw)):
        for name, v in zip(uniq, np.bincount(idx, weights=values, minlength=len(uniq)).tolist()):
            fam.add_metric([name], v)
        out.append(fam)
    return out


def _labels(key: str, labels: tuple[str, ...], by_slot) -> list[str] | None:
    """Label values of a snapshot key; a partition is reported by slot and named here."""
    if not labels:
        return []
    lv = key.split("|")
    if labels[:2] == ("topic", "partition"):
        found = by_slot.get(int(lv[0])) if lv[0].isdigit() else None
        if found is None:
            return None  # a slot no topic has (any more)
        lv = [found[0].name, str(found[1]), *lv[1:]]
    return lv if len(lv) == len(labels) else None


def _family(name: str, kind: str, labels: tuple[str, ...], text: str):
    full = f"tailrace_{name}"
    if kind == "counter":
        return CounterMetricFamily(full, text, labels=list(labels))
    if kind == "histogram":
        return HistogramMetricFamily(full, text, labels=list(labels))
    return GaugeMetricFamily(full, text, labels=list(labels))


def registry_for(s: settings_mod.Settings) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(BrokerCollector(s))
    return reg


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s metrics %(levelname)s %(message)s")
    s = settings_mod.from_env()
    where = s.metrics_address()
    if where is None:
        log.info("metrics endpoint off (--metrics-bind off)")
        return 0
    claim = datadir.enter_program(s, datadir.METRICS_ROLE, log)
    if claim is None:
        return datadir.EXIT_REFUSED
    stop: list = []
    datadir.stop_on_signals(stop)
    try:
        server, thread = start_http_server(where[1], addr=where[0], registry=registry_for(s))
    except OSError as exc:  # the port is taken: say so once, and stay down (supervisord: an expected exit)
        log.error("cannot serve metrics on %s:%d: %s; the broker runs on without them", *where, exc)
        datadir.leave_program(claim)
        return EXIT_NO_PORT
    log.info("serving metrics on http://%s:%d/metrics", *where)
    while not stop:
        time.sleep(0.2)
    server.shutdown()
    thread.join(5)
    datadir.leave_program(claim)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
