"""The ``circuits`` command line.

    circuits print FILE [--depth N] [--shapes] [--serials]
    circuits cost FILE [--depth N] [--by layer|head|node|module]
    circuits profile FILE [--depth N] [--top N] [--trace PATH]
    circuits demo [--batch-size N] [--block-len N] [--seed N] [--depth N]
    circuits parity [--family gpt2|llama|all] [--size tiny|small] [--dtype float32|float64|all] [--seed N]

``print`` reads a circuit file (FORMAT.md text, with the tensor store that
``cc.save`` writes beside it, if there is one) and prints it back in the
canonical form; ``cost`` prints what evaluating it costs
(``circuits.evaluation.costs``); ``profile`` evaluates it timing every node
(``circuits.evaluation.profiling``).  A mistake in the file is one message on stderr,
``FILE:LINE: what is wrong`` followed by the line itself (``FILE: what is
wrong`` when no line is at fault: a missing file, say), and exit status 1;
any other failure of a command (a ``CircuitError``, a file it cannot write, a
seed torch cannot take) is one line ``circuits COMMAND: what is wrong``, exit
status 1; a usage mistake (an unknown option, a value out of range, a
``--trace`` path in no directory) is one line ``circuits COMMAND: what is
wrong``, exit status 2 (argparse's convention, without its usage text).  No
traceback, and nothing from the file reaches the terminal unescaped or uncut
(see ``circuits.errors.shown``): a binary file read by mistake cannot flood
it or send it escape sequences.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from circuits.errors import SHOWN_CHARACTERS, CircuitError, ParseError, StoreError, shown

EXIT_FILE_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
#: How much of an error message is written: its own words, with what it quotes
#: from the file (a line, a name) cut by ``shown``, never megabytes of input.
MESSAGE_CHARACTERS = 4 * SHOWN_CHARACTERS


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a usage mistake written as one line (what is wrong and where to read more),
    not the usage text and the message; subcommands' parsers are of this class too."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: {shown(message, MESSAGE_CHARACTERS)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="circuits",
        description="Transformers as immutable circuits of small named nodes: print saved circuits and their "
        "costs, run the demo, "
        "check gradient parity with Hugging Face.",
        epilog="Run 'circuits COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    show = commands.add_parser(
        "print",
        help="pretty-print a saved circuit file",
        description="Read a circuit file (the FORMAT.md text written by cc.save or circuit.repr(), with "
        "its tensor store FILE-without-suffix.tensors/ if present) and print it.",
    )
    show.add_argument("file", metavar="FILE", help="a circuit text file (.circ), or - for standard input")
    show.add_argument(
        "--depth",
        type=_depth,
        default=None,
        metavar="N",
        help="stop N levels below the root, writing '... K children not shown' (for reading only)",
    )
    show.add_argument(
        "--shapes", action="store_true", help="write every node's shape, not only leaves' and Index's"
    )
    show.add_argument("--serials", action="store_true", help="give every node a serial number")
    show.set_defaults(run=_print_command)

    _add_cost(commands)
    _add_profile(commands)

    from circuits.cli import demo

    run_demo = commands.add_parser(
        "demo",
        help="induction heads in the shipped 2-layer model, found by ablating each head",
        description="Load the shipped 2-layer attention-only model as a circuit, split its heads, evaluate "
        "the loss on rows of BOS + random block + the same block, and zero-ablate each head in turn: the "
        "table of loss increases shows the induction head and the previous-token head it needs. "
        "Takes a few seconds.",
    )
    demo.add_arguments(run_demo)
    run_demo.set_defaults(run=_demo_command)

    parity = commands.add_parser(
        "parity",
        help="gradient parity: backward through the circuit against Hugging Face's own, per parameter",
        description="Build a Hugging Face GPT-2 and a Llama (grouped-query attention) from configs with random "
        "weights, convert them attached (circuits.models.from_hf(..., attach=True)), backpropagate the mean "
        "next-token loss through the circuit and through the model, and print each parameter's max absolute "
        "and relative gradient difference. Exit status 1 if any parameter misses its target (float64: "
        "1e-9 absolute, float32: 1e-5 relative). Needs transformers (pip install 'circuits-interp[hf]').",
    )
    _parity_module().add_arguments(parity)
    parity.set_defaults(run=lambda args: _parity_module().run(args))
    return parser


def _add_cost(commands) -> None:
    costs = commands.add_parser(
        "cost",
        help="the static cost of evaluating a circuit file: FLOPs, bytes, peak memory",
        description="Read a circuit file (as 'print' does; no tensors are needed) and print what evaluating it "
        "costs, from shapes, dtypes and einsum strings alone: totals, FLOPs by kind, bytes read and written, "
        "the peak memory of the evaluator's schedule, then a row per subtree or per group.",
    )
    costs.add_argument("file", metavar="FILE", help="a circuit text file (.circ), or - for standard input")
    costs.add_argument(
        "--depth", type=_depth, default=2, metavar="N", help="a row per subtree down to N levels (default 2)"
    )
    costs.add_argument(
        "--by",
        choices=["layer", "head", "node", "module"],
        default=None,
        help="a row per layer, per head or per named node (by the model naming convention), or per module "
        "of a models.from_torch import (torch.profiler's module view), instead",
    )
    costs.set_defaults(run=_cost_command)


def _add_profile(commands) -> None:
    profiler = commands.add_parser(
        "profile",
        help="evaluate a circuit file timing every node: a table per node name, and the circuit with times",
        description="Read a circuit file with its tensors (as 'print' does), evaluate it once timing every "
        "node (circuits.evaluation.profiling), and print a table per node name (self time, total time, "
        "how many nodes of that name ran), sorted by self time, then the nested table: the circuit down "
        "to --depth, a row per node with its self and total time.",
    )
    profiler.add_argument("file", metavar="FILE", help="a circuit text file (.circ), or - for standard input")
    profiler.add_argument(
        "--depth", type=_depth, default=3, metavar="N", help="write the circuit down to N levels (default 3)"
    )
    profiler.add_argument("--top", type=_depth, default=20, metavar="N", help="table rows (default 20)")
    profiler.add_argument(
        "--trace",
        type=_output_file,
        metavar="PATH",
        help="also write a Chrome trace (chrome://tracing) there",
    )
    profiler.set_defaults(run=_profile_command)


def _parity_module():
    from circuits.cli import parity

    return parity


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    args = build_parser().parse_args(argv)
    command = f"circuits {args.command}"
    try:
        return args.run(args)
    except BrokenPipeError:  # `circuits print big.circ | head`: not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except CircuitError as error:
        return _fail(f"{command}: {shown(str(error), MESSAGE_CHARACTERS)}")
    except OSError as error:  # an output the command cannot write
        where = f"{shown(str(error.filename))}: " if error.filename is not None else ""
        return _fail(f"{command}: {where}{error.strerror or error}")
    except MemoryError:
        return _fail(f"{command}: out of memory")


def _print_command(args: argparse.Namespace) -> int:
    from circuits.text.printing import repr_many

    return _on_file(
        args.file, lambda roots: repr_many(roots, depth=args.depth, shapes=args.shapes, serials=args.serials)
    )


def _cost_command(args: argparse.Namespace) -> int:
    from circuits.experiments.cost_groups import cost_table

    return _on_file(args.file, lambda roots: cost_table(roots, depth=args.depth, by=args.by))


def _profile_command(args: argparse.Namespace) -> int:
    from circuits.evaluation.profiling import profile

    def show(roots: list) -> str:
        parts = []
        for root in roots:
            result = profile(root)
            if args.trace:
                try:
                    result.export_chrome_trace(args.trace)
                except OSError as error:
                    raise OSError(
                        error.errno, f"cannot write the trace: {error.strerror}", args.trace
                    ) from error
            parts.append(result.table(top=args.top or None) + "\n\n" + result.tree(depth=args.depth))
        return "\n\n".join(parts)

    return _on_file(args.file, show)


def _on_file(file: str, show: Callable[[list], str]) -> int:
    """Read the circuits of ``file`` (- for stdin) and print ``show(roots)``; a mistake is one message."""
    from circuits.text.parsing import parse_many
    from circuits.text.saving import load_many, read_text

    source = "<stdin>" if file == "-" else shown(file)
    try:
        if file == "-":
            roots = parse_many(read_text(getattr(sys.stdin, "buffer", sys.stdin), "<stdin>"))
        else:
            roots = load_many(file)
        text = show(roots) if roots else ""
    except ParseError as error:
        where = f"{source}:{error.line_number}" if error.line_number is not None else source
        detail = f"\n    {shown(error.line)}" if error.line is not None else ""
        return _fail(f"{where}: {shown(error.message, MESSAGE_CHARACTERS)}{detail}")
    except StoreError as error:  # names its file, and the line if one is at fault
        return _fail(shown(str(error), MESSAGE_CHARACTERS))
    except CircuitError as error:
        return _fail(f"{source}: {shown(str(error), MESSAGE_CHARACTERS)}")
    if not roots:
        return _fail(f"{source}: no circuit in it (the file is empty or all comments)")
    print(text)
    return 0


def _demo_command(args: argparse.Namespace) -> int:
    from circuits.cli import demo

    try:
        demo.run(args.batch_size, args.block_len, args.seed, args.depth)
    except CircuitError as error:
        return _fail(f"circuits demo: {error}")
    return 0


def _fail(message: str) -> int:
    print(message, file=sys.stderr)
    return EXIT_FILE_ERROR


def _output_file(text: str) -> str:
    """A path a file can be written to: in an existing directory, and not a directory itself."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{shown(text)} is a directory; expected a file name")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"{shown(text)}: no directory {shown(str(path.parent))} to write it in"
        )
    return text


def _depth(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("circuits-interp")  # the distribution's name (pyproject.toml), not the import name
    except Exception:
        return "unknown"


__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
