"""What the commands print: plain tables (rich), JSON, and byte counts and rates for people.

When stdout is not a terminal a table has no colour and is up to 1,000 columns wide, so a table
piped to ``grep`` or ``awk`` keeps one row a line.
"""

from __future__ import annotations

import json
import sys


def print_table(headers: list[str], rows: list[list], title: str | None = None) -> None:
    """A plain table with a header row (rich; no colour when stdout is not a terminal)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    t = Table(*headers, box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False, show_edge=False)
    for r in rows:
        t.add_row(*(str(c) for c in r))
    Console(soft_wrap=True, width=None if sys.stdout.isatty() else 1000).print(t)


def print_json(doc) -> None:
    print(json.dumps(doc, indent=2, default=str))


def as_builtins(o) -> dict:
    import msgspec

    return msgspec.to_builtins(o)


def human_bytes(n) -> str:
    n = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def human_rate(n) -> str:
    n = float(n or 0)
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"
