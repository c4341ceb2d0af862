"""Instructions, not seconds: how building and printing scale from 10^4 to 10^5 nodes.

``bench/format_scale.py`` times each step, and its 10^5/10^4 ratios for
print and build exceed issue 2's target of 12.  This script asks whether
that is the code or the machine: it counts the instructions each step
executes, with valgrind (``--tool=cachegrind --cache-sim=no``), on the
same circuits.  A linear step executes 10x the instructions on 10x the
nodes, whatever the caches do; Python's cyclic garbage collector, which
the build triggers, is counted (it is instructions).

Each count is the difference of two valgrind runs of a child Python that
builds the circuit and prints it 0 or ``--prints`` times (so the import of
torch, which alone executes billions of instructions, cancels out); the
children run with one BLAS/OpenMP thread so that no idle thread pool adds
noise.  Five runs, two at a time; importing torch under valgrind takes
about a minute, so this takes about 4 minutes whatever the sizes.

    python bench/format_instructions.py                    # the issue's sizes
    python bench/format_instructions.py --sizes 1000 10000
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BENCH = Path(__file__).resolve().parent

CHILD = """
import sys
sys.path.insert(0, {bench!r})
from format_scale import build
circuit = build({nodes})
for _ in range({prints}):
    circuit.repr()
"""


def instructions(nodes: int, prints: int, workdir: str) -> int:
    """Instructions executed by a child Python that builds ``nodes`` nodes and prints them ``prints`` times."""
    out = os.path.join(workdir, f"cachegrind.{nodes}.{prints}")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    command = [
        "valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
        sys.executable, "-c", CHILD.format(bench=str(BENCH), nodes=nodes, prints=prints),
    ]  # fmt: skip
    run = subprocess.run(command, check=False, capture_output=True, text=True, env=env)
    found = re.search(r"I\s+refs:\s+([\d,]+)", run.stderr)
    if run.returncode != 0 or found is None:
        raise SystemExit(f"valgrind run failed ({nodes} nodes, {prints} prints):\n{run.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs=2, default=[10_000, 100_000], metavar=("SMALL", "LARGE"))
    parser.add_argument("--prints", type=int, default=2, help="prints per counted run")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    small, large = args.sizes
    runs = [(0, 0), (small, 0), (small, args.prints), (large, 0), (large, args.prints)]
    with tempfile.TemporaryDirectory() as workdir, ThreadPoolExecutor(max_workers=2) as pool:
        counts = dict(zip(runs, pool.map(lambda run: instructions(*run, workdir), runs)))
    build = {n: counts[(n, 0)] - counts[(0, 0)] for n in (small, large)}
    printing = {n: (counts[(n, args.prints)] - counts[(n, 0)]) / args.prints for n in (small, large)}
    for n in (small, large):
        print(
            f"{n:>7} nodes asked: build {build[n] / 1e6:,.1f} M instructions, print {printing[n] / 1e6:,.1f} M"
        )
    print(
        f"headline: instructions for {large / small:g}x nodes asked: build {build[large] / build[small]:.2f}x, "
        f"print {printing[large] / printing[small]:.2f}x"
    )


if __name__ == "__main__":
    main()
