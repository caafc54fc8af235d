"""How `swaplab launch` shows what the library returns: doctor's findings, what `down`
stopped and the gang's status as lines of text, and the `ConsoleObserver` that prints what
`up` and `logs` report as it comes."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from swaplab.launch.cluster import Host
from swaplab.launch.findings import Finding
from swaplab.launch.output import Observer
from swaplab.launch.status import GangStatus

COMMAND_WIDTH = 120


class ConsoleObserver(Observer):
    """Launcher messages to stderr, process output to stdout, each as soon as it comes."""

    def message(self, text: str) -> None:
        print(f"swaplab launch: {text}", file=sys.stderr, flush=True)

    def output(self, line: str) -> None:
        print(line, flush=True)


def doctor_lines(findings: Sequence[Finding]) -> list[str]:
    """One line per finding (`ok  ` or `FAIL`, host, check, detail), a failure's fix under it."""
    lines = []
    for finding in findings:
        mark = "ok  " if finding.ok else "FAIL"
        lines.append(f"{mark}  {finding.host:<16} {finding.check:<8} {finding.detail}")
        if not finding.ok and finding.fix:
            lines.append(f"      {'':<16} {'':<8} fix: {finding.fix}")
    return lines


def doctor_summary(findings: Sequence[Finding]) -> str:
    failed = sum(not finding.ok for finding in findings)
    return f"doctor: {len(findings) - failed} passed, {failed} failed"


def down_lines(stopped: Mapping[Host, int]) -> list[str]:
    """What `down` stopped on each host."""
    return [
        f"{host.name}: "
        + (f"stopped {count} process(es) or container(s) of the gang" if count else "nothing of the gang was running")
        for host, count in stopped.items()
    ]


def status_lines(status: GangStatus) -> list[str]:
    """The last run here, each rank's processes (or `not running`), the containers, the head."""
    lines = []
    record = status.last_run
    if record is not None:
        lines.append(
            f"last run here: {record.start_id} ({'foreground' if record.foreground else 'detached'}), {record.outcome}"
            + (f": {record.cause.splitlines()[0]}" if record.cause else "")
        )
    for rank in status.ranks:
        if not rank.processes:
            lines.append(f"rank {rank.rank}  {rank.host}  not running")
        for process in rank.processes:
            lines.append(
                f"rank {rank.rank}  {rank.host}  running  pid {process.pid}  run {process.start_id}  "
                f"{_shorten(process.command)}"
            )
    lines += [f"container  {host}  {line}" for host, line in status.containers]
    lines.append(f"head {status.head_url}: " + (f"serving ({status.answer})" if status.answer else "not serving"))
    return lines


def _shorten(text: str, width: int = COMMAND_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
