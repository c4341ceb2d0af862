"""Loading a model's weights: circuits against transformers, in one run (issue 31 item 1).

A random Llama in bf16 (default about 1B parameters: d_model 2048, 20 layers, 16 heads of 128
sharing 4 key/value heads, MLP 5632, vocabulary 32000, untied; ``--quick``: about 100M, one
round) is saved as a sharded safetensors checkpoint (500 MB shards) in a temporary directory.
Each measurement runs in a fresh subprocess, so that none pollutes another's memory; its peak
resident memory is the child's own ``ru_maxrss`` (``os.wait4``).  This process imports neither
torch nor transformers (a child's ``ru_maxrss`` counts the parent it was forked from: the model
is made in a child too).  Every child imports torch, transformers and ``circuits.models``
before it measures, so the baselines are alike.  The kinds alternate, ``--rounds`` times; the
medians are reported.  The files stay in the page cache between children: every load reads
them warm.

- transformers: ``LlamaForCausalLM.from_pretrained(dir, dtype=torch.bfloat16)``: seconds, peak RSS.
- ``load_hf_checkpoint(dir, tokens)``: seconds, peak RSS.
- ``from_hf(model, tokens)`` of the model ``from_pretrained`` loaded in the same child: seconds,
  and resident growth (VmRSS after less before; the first build in a process also imports and
  caches what building needs, so a second build is measured too); then the deferred cost, the
  first ``hash`` of the circuit (every weight's content hash, on ``torch.get_num_threads()``
  threads); then, for comparison, ``from_hf(model, tokens, copy=True)`` (copies, as the
  default did before).

Targets: ``from_hf`` at most 0.2x ``from_pretrained``'s time, growing resident memory by at
most 2% of the weights' bytes; ``load_hf_checkpoint`` at most 1.0x its time and 1.1x its peak
RSS.  The last line is the headline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

GiB = 2**30
TOKENS = 15  # a prompt of 14 tokens and its targets
ARGS = argparse.Namespace(size="1b")  # the model size, for a child too

SIZES = {
    "1b": dict(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=20,
        num_attention_heads=16,
        num_key_value_heads=4,
        vocab_size=32000,
    ),
    "quick": dict(
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=12,
        num_key_value_heads=4,
        vocab_size=32000,
    ),
}


def resident() -> int:
    """This process's resident bytes now (VmRSS)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(kind: str, directory: str, threads: int) -> dict:
    """One measurement, in this (fresh) process."""
    import torch
    import transformers

    import circuits.models as cm

    torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
    tokens = torch.randint(0, 1000, (1, TOKENS), generator=torch.Generator().manual_seed(0))
    out: dict = {"baseline": resident()}
    start = time.perf_counter()
    if kind == "save":
        out["parameters"] = save_checkpoint(directory)
    elif kind == "transformers":
        transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)
        out["seconds"] = time.perf_counter() - start
    elif kind == "checkpoint":
        cm.load_hf_checkpoint(directory, tokens)
        out["seconds"] = time.perf_counter() - start
    else:
        model = transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).eval()
        before = resident()
        start = time.perf_counter()
        circuit = cm.from_hf(model, tokens)
        out["seconds"] = time.perf_counter() - start
        out["growth"] = resident() - before
        before = resident()
        start = time.perf_counter()
        again = cm.from_hf(model, tokens)
        out["again_seconds"] = time.perf_counter() - start
        out["again_growth"] = resident() - before
        del again
        start = time.perf_counter()
        circuit.hash  # computes every weight's content hash
        out["hash_seconds"] = time.perf_counter() - start
        del circuit
        before = resident()
        start = time.perf_counter()
        copied = cm.from_hf(model, tokens, copy=True)
        out["copy_seconds"] = time.perf_counter() - start
        out["copy_growth"] = resident() - before
        del copied
    return out


def run_child(kind: str, directory: str, threads: int, size: str = "") -> dict:
    """``child(kind, ...)`` in a subprocess, with its peak resident bytes (``ru_maxrss``)."""
    process = subprocess.Popen(
        [sys.executable, __file__, "--child", kind, directory, "--threads", str(threads), "--size", size],
        stdout=subprocess.PIPE,
        text=True,
    )
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"the {kind} child failed ({process.returncode})")
    result = json.loads(output.strip().splitlines()[-1])
    result["peak"] = usage.ru_maxrss * 1024  # KiB on Linux
    return result


def save_checkpoint(directory: str) -> int:
    """A random bf16 Llama of ``SIZES[ARGS.size]`` saved in ``directory``; its parameter count.

    Made on the meta device and drawn in bf16 (normal, std 0.02; norms 1): transformers' own
    float32 initialisation of 1B parameters takes minutes on two cores."""
    import torch
    import transformers

    config = transformers.LlamaConfig(**SIZES[ARGS.size], tie_word_embeddings=False, dtype=torch.bfloat16)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.fill_(1.0)
            else:
                parameter.normal_(0.0, 0.02, generator=generator)
    model.save_pretrained(directory, max_shard_size="500MB")
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 100M-parameter model, one round")
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (--quick: 1)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", nargs=2, metavar=("KIND", "DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--size", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    ARGS.size = args.size or ("quick" if args.quick else "1b")
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.threads)))
        return
    rounds = args.rounds or (1 if args.quick else 3)
    size = ARGS.size
    print(f"load average at the start (other processes share the cores): {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="load_weights_") as directory:
        start = time.perf_counter()
        count = run_child("save", directory, args.threads, size)["parameters"]
        weight_bytes = 2 * count
        shards = sorted(name for name in os.listdir(directory) if name.endswith(".safetensors"))
        print(
            f"random Llama {SIZES[size]}: {count / 1e6:.0f}M parameters, {weight_bytes / GiB:.2f} GiB in bf16, "
            f"{len(shards)} safetensors shards (made and saved in {time.perf_counter() - start:.0f} s); "
            f"{args.threads} threads; {rounds} rounds, medians"
        )
        runs: dict[str, list[dict]] = {"transformers": [], "checkpoint": [], "from_hf": []}
        for _ in range(rounds):
            for kind in runs:
                runs[kind].append(run_child(kind, directory, args.threads, size))
    report(runs, weight_bytes)


def report(runs: dict[str, list[dict]], weight_bytes: int) -> None:
    def median(kind: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[kind])

    hf_s, hf_peak = median("transformers", "seconds"), median("transformers", "peak")
    ck_s, ck_peak = median("checkpoint", "seconds"), median("checkpoint", "peak")
    base = median("transformers", "baseline")
    fh_s, growth = median("from_hf", "seconds"), median("from_hf", "growth")
    print(
        f"transformers from_pretrained: {hf_s:.2f} s, peak RSS {hf_peak / GiB:.2f} GiB "
        f"(after imports {base / GiB:.2f} GiB)"
    )
    print(
        f"load_hf_checkpoint:           {ck_s:.2f} s, peak RSS {ck_peak / GiB:.2f} GiB "
        f"(after imports {median('checkpoint', 'baseline') / GiB:.2f} GiB): "
        f"{ck_s / hf_s:.2f}x the time (target 1.0x), {ck_peak / hf_peak:.2f}x the peak (target 1.1x)"
    )
    print(
        f"from_hf of the loaded model:  {fh_s:.3f} s = {fh_s / hf_s:.3f}x from_pretrained (target 0.2x), "
        f"resident +{growth / 2**20:.1f} MiB = {100 * growth / weight_bytes:.2f}% of the weights' bytes "
        f"(target 2%); a second build: {median('from_hf', 'again_seconds'):.3f} s, "
        f"+{median('from_hf', 'again_growth') / 2**20:.1f} MiB"
    )
    print(
        f"  then its first hash (every weight's content hash, deferred): {median('from_hf', 'hash_seconds'):.2f} s; "
        f"from_hf(copy=True): {median('from_hf', 'copy_seconds'):.2f} s, "
        f"resident +{median('from_hf', 'copy_growth') / GiB:.2f} GiB"
    )
    print(f"load average at the end: {os.getloadavg()}")
    print(
        f"headline: from_hf {fh_s / hf_s:.3f}x from_pretrained's time, +{100 * growth / weight_bytes:.2f}% "
        f"resident; load_hf_checkpoint {ck_s / hf_s:.2f}x its time, {ck_peak / hf_peak:.2f}x its peak RSS"
    )


if __name__ == "__main__":
    main()
