"""Where the CPU's time goes in warm edits: reads a sampling profile (py-spy's raw format: one stack per line, its
frames joined by ';', then its sample count) of `lab/probes/profile_edit.py --cpu-runs N` and keeps the samples
under cpu_sampled_runs.

    py-spy record --rate 500 --format raw -o stacks.txt -- python3 lab/probes/profile_edit.py --cpu-runs 10
    python3 lab/probes/cpu_stacks.py stacks.txt [--top 40] [--json FILE]
Prints, per function, the share of those samples it was on the stack for (inclusive) and at the top of (own).
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

MARKER = "cpu_sampled_runs"


def read_samples(path: Path) -> list[tuple[list[str], int]]:
    samples = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if count.isdigit() and any(frame.startswith(MARKER) for frame in frames):
            samples.append((frames, int(count)))
    return samples


def shares(samples) -> dict[str, list]:
    total = sum(count for _, count in samples)
    inclusive, own = Counter(), Counter()
    for frames, count in samples:
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
    return {"samples": total,
            "inclusive": [(frame, n / total) for frame, n in inclusive.most_common()],
            "own": [(frame, n / total) for frame, n in own.most_common()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stacks", type=Path)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    found = shares(read_samples(args.stacks))
    print(f"{found['samples']} samples under {MARKER}")
    for kind in ("inclusive", "own"):
        print(f"-- {kind}")
        for frame, share in found[kind][:args.top]:
            print(f"{share:6.1%}  {frame[:170]}")
    if args.json:
        args.json.write_text(json.dumps({kind: found[kind][:200] if kind != "samples" else found[kind]
                                         for kind in found}, indent=1))


if __name__ == "__main__":
    main()
