"""What the benchmark scripts share: timing, peak memory, and the GPT-2-small size flags.

Scripts run as ``python bench/NAME.py``, so this directory is on the path.  Only the standard
library is imported at the top: other venvs' scripts (``circuit_tracer_side.py``) import this too.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any


def best_time(action: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """The fastest of ``repeat`` runs (the usual guard against a busy machine) and its result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = action()
        best = min(best, time.perf_counter() - start)
    return best, result


def add_gpt2_size_arguments(parser: argparse.ArgumentParser, rounds: int) -> None:
    """Flags for the model and batch size; the defaults are GPT-2 small on 8 x 128 tokens."""
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--threads", type=int, default=2)


def patching_inputs(args: argparse.Namespace):
    """Seeded ``(clean, corrupted, good, bad)`` for a patching benchmark: ``clean`` tokens
    ``[batch, seq + 1]``, ``corrupted`` the same with every third position redrawn, and one good and
    one bad answer token per row (``args``: ``seed``, ``vocab``, ``batch``, ``seq``)."""
    import torch

    generator = torch.Generator().manual_seed(args.seed + 1)
    clean = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=generator)
    corrupted = clean.clone()
    corrupted[:, ::3] = torch.randint(0, args.vocab, corrupted[:, ::3].shape, generator=generator)
    good, bad = torch.randint(0, args.vocab, (2, args.batch), generator=generator)
    return clean, corrupted, good, bad


def gc_timed(action: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds ``action`` takes after a full collection (no run pays for another's garbage), and its result."""
    import gc

    gc.collect()
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def native_gpt2_circuit(args: argparse.Namespace):
    """The native builder's GPT-2 of the size flags (random weights, seed 0) on seeded tokens;
    prints what it built."""
    import torch

    import circuits as cc
    from circuits.models.gpt2 import GPT2Config, build_gpt2, gpt2_random_weights

    config = GPT2Config(
        n_layers=args.layers,
        n_heads=args.heads,
        d_model=args.d_model,
        vocab_size=args.vocab,
        n_ctx=max(1024, args.seq + 1),
    )
    tokens = torch.randint(
        0, args.vocab, (args.batch, args.seq + 1), generator=torch.Generator().manual_seed(1)
    )
    circuit = build_gpt2(config, gpt2_random_weights(config, seed=0), tokens)
    print(
        f"GPT-2 {args.layers} layers, {args.heads} heads, d_model {args.d_model}, vocab {args.vocab}; "
        f"batch {args.batch} x {args.seq}; {args.threads} threads; {len(cc.unique_nodes(circuit))} nodes"
    )
    return circuit


def hf_gpt2_model(args: argparse.Namespace):
    """A Hugging Face GPT-2 of the size flags with random weights (seeded), in eval mode."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=args.layers,
        n_head=args.heads,
        n_embd=args.d_model,
        vocab_size=args.vocab,
        n_positions=max(1024, args.seq),
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config).eval()


def tl_gpt2_model(args: argparse.Namespace):
    """A TransformerLens 4 GPT-2 of the size flags (and ``args.seed``), every parameter perturbed.

    TransformerLens 4 has no ``HookedTransformer``: this is its natively booted model
    (``TransformerBridge.boot_native``) in GPT-2's layout, what ``HookedTransformer(cfg)`` was.  It
    initialises biases to 0 and norms to 1: each parameter gets noise so each one matters.
    """
    import torch
    from transformer_lens import TransformerBridgeConfig
    from transformer_lens.model_bridge.sources import boot_native

    cfg = TransformerBridgeConfig(
        n_layers=args.layers,
        n_heads=args.heads,
        d_model=args.d_model,
        d_head=args.d_model // args.heads,
        d_mlp=4 * args.d_model,
        d_vocab=args.vocab,
        n_ctx=max(1024, args.seq + 1),
        act_fn="gelu_new",
        normalization_type="LN",
        seed=args.seed,
    )
    model = boot_native(cfg).eval()
    generator = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.02)
    return model


def threshold_between(pre, count: int) -> float:
    """A JumpReLU threshold that exactly ``count`` of ``pre`` (a torch tensor) exceed, halfway between
    the ``count``-th largest and the next, and at least 0.  Not a quantile: that interpolates, and the
    ``1 - l0/features`` one fell a few float32 ulps from one pre-activation per layer (at ``--l0 1``,
    within 1.2e-6 relative), which two correct float32 forwards then put on either side of it."""
    top = pre.flatten().topk(count + 1).values
    return max(float((top[-2] + top[-1]) / 2), 0.0)


def peak_bytes(run) -> int:
    """The most bytes torch allocated at once during ``run()`` (torch.profiler's memory events).

    The profiler records every operator's event as well: at large sizes that record itself grows to
    gigabytes (circuit-tracer's attribution graph at SmolLM2-135M's dimensions passed 23 GB), so
    large runs use ``resident_peak`` instead."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def _status_bytes(field: str) -> int:
    """A ``/proc/self/status`` field in bytes (``VmRSS``: resident now, ``VmHWM``: its high-water mark)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024  # the kernel writes kB
    raise KeyError(f"/proc/self/status has no {field} field")


def release_free_memory() -> None:
    """Collect garbage and hand the C allocator's freed pages back to the kernel (glibc's
    ``malloc_trim``), so that memory a warm-up call freed is not counted as resident before the
    measured call (which would hide that much of its peak)."""
    gc.collect()
    libc = ctypes.util.find_library("c")
    if libc is not None and hasattr(ctypes.CDLL(libc), "malloc_trim"):
        ctypes.CDLL(libc).malloc_trim(0)


def resident_peak(run: Callable[[], Any], on_start: Callable[[int], None] | None = None) -> tuple[dict, Any]:
    """``run()``'s own peak in resident memory, its seconds, and its result.

    Frees what it can (``release_free_memory``), reads the resident set (``VmRSS``), resets the
    kernel's high-water mark (writing 5 to ``/proc/self/clear_refs``, Linux 4.0 or later), runs,
    and reads the mark (``VmHWM``): ``peak_bytes`` is the mark less the resident set before, the
    most memory the call added at once, whoever allocated it (torch, Python, the C allocator's
    overhead).  Nothing is recorded during the call, so it costs nothing at any size.
    ``on_start(rss_before)`` is called just before ``run`` (to report it while the run may yet be
    killed).  Returns ``({"seconds", "rss_before", "peak_bytes"}, result)``."""
    release_free_memory()
    before = _status_bytes("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    if on_start is not None:
        on_start(before)
    start = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - start
    high = _status_bytes("VmHWM")
    return dict(seconds=seconds, rss_before=before, peak_bytes=high - before), result


def print_json(record: dict) -> None:
    """One JSON line on stdout, flushed (how bench children report to their parent)."""
    print(json.dumps(record), flush=True)


@dataclass(frozen=True)
class Watched:
    """A child process's end: its exit status, its output, and ``killed_rss`` (bytes) when the
    watchdog killed it for passing the limit (``None`` otherwise)."""

    returncode: int
    stdout: str
    stderr: str
    killed_rss: int | None

    def records(self) -> dict:
        """The child's JSON lines (``print_json``) merged in order: later keys win."""
        merged = {}
        for line in self.stdout.splitlines():
            if line.startswith("{"):
                merged.update(json.loads(line))
        return merged


def _rss_of(pid: int) -> int:
    """Process ``pid``'s resident set in bytes (0 once it has gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def run_watched(command: list[str], rss_limit: int, poll_seconds: float = 0.05) -> Watched:
    """Run ``command`` and kill it (SIGKILL) if its resident set passes ``rss_limit`` bytes: a
    run that would exhaust the machine's memory is reported as having passed the limit, not left
    to the kernel's out-of-memory killer.  Its output goes to files (a full pipe cannot stall it)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        killed = None
        while child.poll() is None:
            rss = _rss_of(child.pid)
            if rss > rss_limit:
                os.kill(child.pid, signal.SIGKILL)
                killed = rss
                child.wait()
                break
            time.sleep(poll_seconds)
        out.seek(0)
        err.seek(0)
        return Watched(child.returncode, out.read(), err.read(), killed)
