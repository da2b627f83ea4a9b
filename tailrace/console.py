"""``tailrace produce`` and ``tailrace consume``: the console producer and consumer.

produce streams: a line is sent within ``linger_ms`` of arriving, or, under load, as soon as the
lines before it are acknowledged (batches grow then: ``LineProducer``), so ``tail -f app.log |
tailrace produce t`` delivers continuously; stdin is read with ``os.read`` as data comes, never
to its end first. Ctrl-C sends what was read, says how many were acked and
exits 130; SIGTERM and SIGHUP do the same and exit 143 and 129 (``Stopped``).

produce ``--header`` gives every record the same headers (one list, repeated: no Python step
per line) and ``--compression`` compresses each batch (client/codecs.py).

consume prints one line per record: the value, or what ``--print-*``, ``--format`` (kcat's
tokens) or ``--json`` ask for. Headers print as ``k1=v1,k2=v2`` (``header_text``), the form
``--header`` takes. Stopped by Ctrl-C, SIGTERM or SIGHUP, a ``--group`` consumer
leaves its group before it exits, so its partitions go to the others (and ``groups
reset-offsets`` is allowed) at once, not after the 45 s session timeout.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import select
import signal
import sys
import time

from tailrace.client import codecs
from tailrace.client.columns import TIMESTAMP_TYPES
from tailrace.client.consumer import EARLIEST, LATEST, Consumer, Record
from tailrace.client.errors import InvalidRequestError, TailraceError, UnknownPartitionError
from tailrace.client.producer import Producer

READ_BYTES = 1 << 20  # a pipe gives at most its 64 KiB buffer; a file redirected in, this much per read
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130  # the command line's exit codes
FROM_NAMES = {"earliest": EARLIEST, "beginning": EARLIEST, "latest": LATEST, "end": LATEST}
INT64_MAX = (1 << 63) - 1  # offsets, byte counts and milliseconds travel as int64 (msgspec, numpy)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Stopped(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM or SIGHUP: the command stops as it does for Ctrl-C
    (produce sends what it read, a group consumer leaves its group at once instead of holding
    its partitions for the session timeout), then exits 128 + the signal's number."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP raise ``Stopped``; a second one takes the default action (dies at once)."""
    def raise_stopped(signum, _frame):
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        raise Stopped(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, raise_stopped)


def interrupted_code(exc: KeyboardInterrupt) -> int:
    """130 for Ctrl-C, 128 + N for signal N (143 for SIGTERM), as a shell reports them."""
    return 128 + exc.signum if isinstance(exc, Stopped) else EXIT_INTERRUPTED


# --- produce -----------------------------------------------------------------------------------
HANDOFF_BYTES = 16 << 20  # lines kept at most before the producer must take them (half its buffer_memory)


class LineProducer:
    """Split stdin's bytes into lines and hand them to the producer in batches, one
    ``send_batch`` per partition.

    Why not ``Producer.send`` per line: each send visits every partition with lingering records,
    and over 1,000 partitions that was ~0.3 ms of Python per line, long enough for most
    partitions' linger to run out holding one record: 100,000 lines made 96,660 requests and took
    29 s against 5.3 s for 300,000 lines over 6 partitions (docs/BENCHMARKS.md, "tailrace produce
    over many partitions"). Here the lines read are kept (split in C, keys cut by one regex) and
    handed over (``handoff``) when ``due``: they have waited ``linger_ms`` and the producer has
    nothing queued or unacknowledged, or stdin ended. A line on a quiet stream is sent within
    linger_ms; under load the next batches grow while the last ones are acknowledged, as Kafka's
    accumulator does per partition. At ``HANDOFF_BYTES`` kept, stdin is not read until the
    producer has caught up.

    Partitions are chosen per line without a Python step per line: by the producer's key hash
    (``send_batch`` groups by ``hash_partitions``), a fixed ``--partition``, or round robin over
    lines (every P-th line of a handoff to one partition: a list slice). ``headers`` (``--header``)
    go with every line as the one list object repeated, made by a list product, not a loop.
    """

    def __init__(self, prod: Producer, topic: str, *, key: bytes | None, separator: bytes | None,
                 partition: int | None, linger_s: float = 0.005, headers: list | None = None, delay_ms: int | None = None):
        self.prod, self.topic, self.key, self.sep, self.partition = prod, topic, key, separator, partition
        self.delay_ms = delay_ms  # --delay: each line is appended this long after it was read (router/timer.py)
        self.headers = headers or None  # [(key str, value bytes or None), ...]: every line's
        self.linger_s = linger_s
        self.pair = None if separator is None else re.compile(b"(?m)^(.*?)" + re.escape(separator) + b"(.*)$")
        self.partial = b""
        self.lines = 0  # lines read (kept or handed over)
        self.values: list[bytes] = []  # lines kept, not yet handed over
        self.keys: list[bytes] = []  # their keys (with --key-separator)
        self.kept_bytes = 0
        self.since = 0.0  # when the oldest kept line was read
        self.rr = 0  # round robin: the partition of the next line

    def feed(self, data: bytes) -> None:
        """Keep every complete line in ``data`` (plus what an earlier call left unfinished)."""
        data = self.partial + data
        cut = data.rfind(b"\n")
        if cut < 0:
            self.partial = data
            return
        self.partial = data[cut + 1:]
        self._keep(data[:cut])

    def _keep(self, block: bytes) -> None:
        lines = block.split(b"\n")
        if not self.values:
            self.since = time.monotonic()
        if self.pair is not None:
            pairs = self.pair.findall(block)
            if len(pairs) != len(lines):  # a line without the separator: the ones before it still go
                bad = next(i for i, line in enumerate(lines) if self.sep not in line)
                if bad:
                    self._keep(b"\n".join(lines[:bad]))  # counts them in self.lines
                raise InvalidRequestError(f"line {self.lines + 1} has no key separator {self.sep.decode(errors='replace')!r}")
            keys, values = zip(*pairs)
            self.keys.extend(keys)
            self.values.extend(values)
        else:
            self.values.extend(lines)
        self.lines += len(lines)
        self.kept_bytes += len(block)

    def due(self, now: float) -> bool:
        return bool(self.values) and now - self.since >= self.linger_s and not self.prod.busy

    def wait_s(self, now: float) -> float:
        """How long until kept lines are due (if the producer is idle by then); 0.2 s with none."""
        return max(0.0, self.since + self.linger_s - now) if self.values else 0.2

    def full(self) -> bool:
        return self.kept_bytes >= HANDOFF_BYTES

    def handoff(self) -> None:
        """Hand every kept line to the producer (which sends what it may at once)."""
        values, keys = self.values, self.keys
        self.values, self.keys, self.kept_bytes = [], [], 0
        if not values:
            return
        if self.key is not None:
            keys = [self.key] * len(values)
        elif self.sep is None:
            keys = None
        headers = None if self.headers is None else [self.headers] * len(values)
        if self.delay_ms is not None:  # one send per line: a delayed line is the exception, not the stream
            for i, v in enumerate(values):
                self.prod.send(self.topic, v, None if keys is None else keys[i], self.headers, partition=self.partition,
                               deliver_after_ms=self.delay_ms)
            self.prod.flush_delayed()
            return
        if self.partition is not None or keys is not None:
            self.prod.send_batch(self.topic, values, keys, partition=self.partition, headers=headers)
            return
        count = self.prod.partitions_for(self.topic)
        for k in range(min(count, len(values))):
            self.prod.send_batch(self.topic, values[k::count], partition=(self.rr + k) % count,
                                 headers=None if headers is None else headers[k::count])
        self.rr = (self.rr + len(values)) % count

    def finish(self) -> None:
        """stdin ended: a last line without a newline is a line too; everything is handed over."""
        if self.partial:
            line, self.partial = self.partial, b""
            self._keep(line)
        self.handoff()


def parse_header(text: str) -> tuple[str, bytes | None]:
    """``--header``: KEY=VALUE, KEY= (an empty value) or KEY alone (a null value, Kafka's null
    header value). The value is the bytes the shell passed (``os.fsencode``: not UTF-8 is fine);
    the key must be text, and ends at the first ``=``."""
    key, sep, value = text.partition("=")
    if not key:
        raise argparse.ArgumentTypeError(f"{text!r}: KEY=VALUE, KEY= (an empty value) or KEY (a null value)")
    try:
        key.encode()
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"{text!r}: a header key must be UTF-8 text") from None
    return key, os.fsencode(value) if sep else None


LEVELS = (min(lo for lo, _ in codecs.LEVEL_RANGES.values()), max(hi for _, hi in codecs.LEVEL_RANGES.values()))


def level_error(compression: str, level: int | None) -> str | None:
    """Why ``--compression-level`` does not suit ``--compression`` (each codec has its own range),
    or None."""
    if level is None:
        return None
    codec = codecs.codec_id(compression)
    if codec not in codecs.LEVEL_RANGES:
        return f"--compression-level applies to {', '.join(codecs.NAMES[c] for c in codecs.LEVEL_RANGES)}, not {compression}"
    lo, hi = codecs.LEVEL_RANGES[codec]
    if not lo <= level <= hi:
        return f"--compression-level {level}: {compression} takes {lo} to {hi}"
    return None


_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
MAX_DURATION_MS = 3650 * 86_400_000  # ten years: far past any broker's delay_max_ms, well inside the wire's int64


def duration_ms(text: str) -> int:
    """``30s``, ``500ms``, ``2m``, ``1h``, ``1d`` (a bare number: ms) as milliseconds (argparse type)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (30s, 500ms, 2m, 1h, 1d)")
    ms = int(float(m.group(1)) * _UNITS_MS[m.group(2) or "ms"])
    if ms > MAX_DURATION_MS:
        raise argparse.ArgumentTypeError(f"{text!r} is more than 3650 days")
    return ms


def produce(args, stdin_fd: int = 0) -> int:
    key = args.key.encode() if args.key is not None else None
    sep = args.key_separator.encode() if args.key_separator is not None else None
    keyed = key is not None or sep is not None
    bad_level = level_error(args.compression, args.compression_level)
    if bad_level is not None:
        say(f"tailrace produce: {bad_level}")
        return EXIT_USAGE
    prod = Producer(args.bootstrap, acks=args.acks, linger_ms=args.linger_ms,
                    partitioner="key_hash" if keyed else "round_robin", connect_timeout_ms=args.connect_timeout_ms,
                    key_file=args.key_file, server_key=args.server_key,
                    compression=args.compression, compression_level=args.compression_level)
    lines = LineProducer(prod, args.name, key=key, separator=sep, partition=args.partition,
                         linger_s=args.linger_ms / 1000, headers=args.header, delay_ms=args.delay)
    try:
        if args.partition is not None:  # a wrong partition is one line at once, not a retry loop
            count = prod.partitions_for(args.name)
            if not 0 <= args.partition < count:
                raise UnknownPartitionError(f"topic {args.name!r} has partitions 0-{count - 1}; no partition {args.partition}")
        else:
            prod.partitions_for(args.name)  # an unknown topic fails before any line is read
        _pump_stdin(prod, lines, stdin_fd)
        lines.finish()
        acked = prod.flush()
    except KeyboardInterrupt as stop:
        try:
            lines.finish()
            prod.flush(10_000)
        except (KeyboardInterrupt, TailraceError) as exc:  # a second Ctrl-C, or what was read failed
            if isinstance(exc, TailraceError):
                say(f"tailrace: {exc}")
        say(f"interrupted: produced {prod.acked_records} messages")
        return interrupted_code(stop)
    except BaseException:
        if lines.lines:
            try:
                lines.handoff()  # what was read before the error still goes out
                prod.flush(5_000)
            except Exception:
                pass
            say(f"produced {prod.acked_records} messages before the error")
        raise
    finally:
        prod.pool.close()  # no flush here: the paths above did it, as far as they could
    say(f"produced {acked} messages")
    return EXIT_OK


def _pump_stdin(prod: Producer, lines: LineProducer, fd: int) -> None:
    """Read stdin as it comes; between reads take in the producer's replies and hand it the lines
    kept once they are due (``LineProducer``)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    while True:
        if lines.full():  # backpressure: stdin waits while the producer catches up
            while prod.busy:
                prod.poll(50)
                _raise_first(prod)
            lines.handoff()
        now = time.monotonic()
        wait_s = lines.wait_s(now)
        if prod.busy:
            wait_s = min(wait_s, max(0.001, prod.linger_s))
        if poller.poll(max(0, int(wait_s * 1000 + 0.999))):
            data = os.read(fd, READ_BYTES)
            if not data:
                return
            lines.feed(data)
            if not lines.full() and poller.poll(0):
                continue  # more is there already (a file, a backed-up pipe): one handoff takes it all
        prod.poll(0)
        _raise_first(prod)
        if lines.due(time.monotonic()):
            lines.handoff()


def _raise_first(prod: Producer) -> None:
    if prod.errors:
        raise prod.errors.pop(0)


# --- consume -----------------------------------------------------------------------------------
def int_at_least(minimum: int, expected: str = "an integer", maximum: int = INT64_MAX):
    """An argparse type: an integer in ``[minimum, maximum]``, or a one-line usage error (every
    numeric option has both bounds: a number too big for the wire is a usage error here, not an
    OverflowError from the encoder)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, not {text!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {n}")
        if n > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:,}, not {text}")
        return n
    return parse


def float_above(minimum: float, or_equal: bool = False, maximum: float = 1e9):
    """An argparse type: a finite number > ``minimum`` (>= with ``or_equal``) and <= ``maximum``,
    or a one-line usage error."""
    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
        if not (x >= minimum if or_equal else x > minimum) or x != x:
            raise argparse.ArgumentTypeError(f"must be {'at least' if or_equal else 'more than'} {minimum:g}, not {text}")
        if x > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g}, not {text}")
        return x
    return parse


_offset = int_at_least(0, "earliest, beginning, latest, end or an offset")


def parse_from(text: str) -> str | int:
    """``--from``: earliest/beginning, latest/end, or an offset (>= 0)."""
    return FROM_NAMES[text] if text in FROM_NAMES else _offset(text)


def parse_time(text: str) -> int:
    """``--from-time``: ISO 8601 (``2026-11-23T10:00:00Z``; no zone means UTC) or ms since the
    epoch; returns ms since the epoch."""
    import argparse
    from datetime import datetime, timezone

    t = text.strip()
    if t.isdigit():
        return _offset(t)  # ms since the epoch: an int64 too
    try:
        d = datetime.fromisoformat(t[:-1] + "+00:00" if t.endswith(("Z", "z")) else t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: an ISO 8601 time (2026-11-23T10:00:00Z) or ms since the epoch") from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=timezone.utc)
    return int(d.timestamp() * 1000)


def _text(b: bytes | None, b64: bool) -> str | None:
    if b is None:
        return None
    return base64.b64encode(b).decode() if b64 else b.decode("utf-8", "replace")


def header_text(headers) -> bytes:
    """A record's headers as one field: ``k1=v1,k2=v2`` in the order sent, repeats kept, a null
    value as the key alone (as ``--header`` takes it), nothing for none. Nothing is escaped: a
    ``,`` or ``=`` inside a header prints as it is (``--json`` is unambiguous)."""
    return b",".join(k.encode() if v is None else k.encode() + b"=" + v for k, v in headers)


def _type_name(r: Record) -> bytes:
    return TIMESTAMP_TYPES[r.timestamp_type].encode()


def formatter(args):
    """A function from a list of records to the bytes to print for them."""
    if args.json:
        b64 = args.base64

        def as_json(records: list[Record]) -> bytes:
            return "".join(json.dumps({"topic": r.topic, "partition": r.partition, "offset": r.offset,
                                       "timestamp": r.timestamp, "timestamp_type": TIMESTAMP_TYPES[r.timestamp_type],
                                       "key": _text(r.key, b64), "value": _text(r.value, b64),
                                       "headers": [{"key": k, "value": _text(v, b64)} for k, v in r.headers]},
                                      ensure_ascii=False) + "\n"
                           for r in records).encode()
        return as_json
    if args.format is not None:
        return args.format  # kcat_format made it
    fields = []  # Kafka's console consumer's order: time, partition, offset, headers, key, value
    if args.print_timestamp:
        fields.append(lambda r: _type_name(r) + b":%d" % r.timestamp)
    if args.print_partition:
        fields.append(lambda r: b"Partition:%d" % r.partition)
    if args.print_offset:
        fields.append(lambda r: b"Offset:%d" % r.offset)
    if args.print_headers:
        fields.append(lambda r: header_text(r.headers))
    if args.print_key:
        fields.append(lambda r: b"null" if r.key is None else r.key)
    if not fields:
        return lambda records: b"".join(r.value + b"\n" for r in records)
    fields.append(lambda r: r.value)
    return lambda records: b"".join(b"\t".join(f(r) for f in fields) + b"\n" for r in records)


TOKENS = {
    "t": lambda r: r.topic.encode(), "p": lambda r: b"%d" % r.partition, "o": lambda r: b"%d" % r.offset,
    "k": lambda r: r.key or b"", "K": lambda r: b"%d" % len(r.key or b""), "v": lambda r: r.value,
    "s": lambda r: r.value, "S": lambda r: b"%d" % len(r.value), "T": lambda r: b"%d" % r.timestamp,
    "h": lambda r: header_text(r.headers), "y": _type_name,
}


def kcat_format(fmt: str):
    """kcat's ``-f``: %t topic, %p partition, %o offset, %k key, %K key bytes, %v or %s value, %S
    value bytes, %T timestamp (ms), %h headers (``header_text``), %% a percent sign, \\n \\t
    \\\\ escapes; and, not kcat's, %y the timestamp's type (CreateTime or LogAppendTime). A line
    ends each record unless the format has its own \\n."""
    parts: list = []
    i, lit, ends_line = 0, [], False
    while i < len(fmt):
        c = fmt[i]
        if c in "%\\" and i + 1 < len(fmt):
            n = fmt[i + 1]
            if c == "%" and n in TOKENS:
                if lit:
                    parts.append("".join(lit).encode())
                    lit = []
                parts.append(TOKENS[n])
            elif c == "%" and n == "%":
                lit.append("%")
            elif c == "\\" and n in "nt\\":
                lit.append({"n": "\n", "t": "\t", "\\": "\\"}[n])
                ends_line = ends_line or n == "n"
            else:
                raise argparse.ArgumentTypeError(f"unknown token {c}{n} (known: %t %p %o %k %K %v %s %S %T %h %y %% \\n \\t)")
            i += 2
            continue
        lit.append(c)
        i += 1
    if not ends_line and "\n" not in fmt:
        lit.append("\n")
    if lit:
        parts.append("".join(lit).encode())
    return lambda records: b"".join(b"".join(p if isinstance(p, bytes) else p(r) for p in parts) for r in records)


def consume(args) -> int:
    start = EARLIEST if args.from_beginning else args.from_
    render = formatter(args)
    out = sys.stdout.buffer
    seen = 0
    group = getattr(args, "group", None)
    if group is not None and (args.partition is not None or args.from_time is not None or start not in (EARLIEST, LATEST)):
        say("with --group the group's committed offsets say where to start: --from earliest|latest only says where "
            "a partition without one starts (--partition, --from-time and --from OFFSET do not apply)")
        return EXIT_USAGE
    # in a group, what is printed is committed, and only that (auto-commit would also commit what
    # a poll returned beyond --max)
    extra = {} if group is None else {"group": group, "auto_offset_reset": start, "auto_commit": False}
    cons = Consumer(args.bootstrap, isolation=args.isolation, connect_timeout_ms=args.connect_timeout_ms,
                    key_file=args.key_file, server_key=args.server_key, **extra)
    try:
        if group is not None:
            # a group that subscribes to no topic is simply given no partitions: ask first, so an
            # unknown topic is UNKNOWN_TOPIC here as it is without --group
            cons.list_offsets(args.name)
            cons.subscribe([args.name])
        else:
            cons.assign(args.name, None if args.partition is None else [args.partition], start=start)
        if args.from_time is not None:
            cons.seek_to_time(args.name, args.from_time)
        last_new = time.monotonic()
        while args.max is None or seen < args.max:
            wait = 500 if args.timeout_ms is None else max(1, min(500, int(args.timeout_ms - (time.monotonic() - last_new) * 1000)))
            records = cons.poll(wait)
            if records:
                last_new = time.monotonic()
                if args.max is not None:
                    records = records[: args.max - seen]
                out.write(render(records))
                out.flush()
                seen += len(records)
                if group is not None:
                    done = {}
                    for r in records:
                        done[(r.topic, r.partition)] = r.offset + 1
                    cons.commit(done)
            elif args.timeout_ms is not None and (time.monotonic() - last_new) * 1000 >= args.timeout_ms:
                break
    except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM or SIGHUP: close() below leaves the group
        say(f"interrupted: consumed {seen} messages")
        return interrupted_code(stop)
    finally:
        cons.close()
    return EXIT_OK
