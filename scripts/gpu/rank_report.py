"""What the torchrun checks beside this file (split_check.py, nccl_graph_check.py) print as they go, on every rank
(that it started, each stage it ends with the seconds since the process group joined, its Python stacks every few
seconds while it runs), and the two options that bound them. A run stopped at its device call's limit shows which
rank got how far and where it waited."""
from __future__ import annotations

import argparse
import faulthandler
import os
import time
from typing import Callable


def add_arguments(parser: argparse.ArgumentParser, collective_timeout_s: float, hang_report_s: float) -> None:
    """--collective-timeout (parallel.setup's: a rank waiting that long in a collective fails the run with an
    error, not a hang that eats the device call) and --hang-report (`started`'s), with the check's defaults."""
    parser.add_argument("--collective-timeout", type=float, default=collective_timeout_s, metavar="S",
                        help="a rank waiting this long in a collective fails the run with an error")
    parser.add_argument("--hang-report", type=float, default=hang_report_s, metavar="S",
                        help="every S seconds while it runs, each rank's Python stacks on stderr (where a "
                             "stopped run was waiting)")


def started(hang_report_s: float) -> None:
    """Before the process group: says the rank started, and prints its stacks every `hang_report_s` seconds until
    `ended`."""
    print(f"rank {os.environ.get('RANK', '?')}: started, joining the process group", flush=True)
    faulthandler.dump_traceback_later(hang_report_s, repeat=True)


def progress_printer(rank: int) -> Callable[[str], None]:
    """A printer of the rank's stages, each with the seconds since it was made."""
    began = time.perf_counter()

    def progress(words: str) -> None:
        print(f"rank {rank} · {time.perf_counter() - began:.1f} s: {words}", flush=True)
    return progress


def ended() -> None:
    faulthandler.cancel_dump_traceback_later()
