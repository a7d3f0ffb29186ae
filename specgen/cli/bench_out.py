"""What both benches write besides their tables: records kept in memory when there
is no --out, the --report page, and checks that an output path is writable
before anything is loaded or timed."""

from __future__ import annotations

import os
from pathlib import Path

from specgen.errors import SpecgenError


class MemorySink:
    """Records kept in memory when there is no --out."""

    def __init__(self) -> None:
        self.records: list[dict] = []

    def done_ids(self) -> set[str]:
        return set()

    def append(self, record: dict) -> None:
        self.records.append(record)

    def close(self) -> None:
        pass


def write_report(con, path: Path, meta: dict, records: list) -> None:
    """The page for --report, after the run (nothing recorded: nothing written)."""
    from specgen.bench.report import write_report as write_page

    if not records:
        con.print(f"report: nothing recorded, {path} not written")
        return
    write_page(path, meta, records)
    con.print(f"report: {path}")


def check_writable(path: Path, flag: str) -> None:
    """Fail before loading models, not after the first hour of runs."""
    if path.is_dir():
        raise SpecgenError(f"cannot write {flag} {path}: it is a directory")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise SpecgenError(f"cannot write {flag} {path}: no directory {parent}")
    if not os.access(path if path.exists() else parent, os.W_OK):
        raise SpecgenError(f"cannot write {flag} {path}: permission denied")
