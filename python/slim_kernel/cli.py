"""`slim-kernel` / `python -m slim_kernel`: one subcommand per module.

Each command module exposes ``add_arguments(parser)`` and ``run(args) -> int`` and is
imported only when its command is parsed, so `slim-kernel audit` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
import warnings

from ._version import __version__

COMMANDS = {
    "info": ("slim_kernel.info", "show versions, devices and, per op, which backends can serve"),
    "precompile": ("slim_kernel.jit.precompile", "compile into the JIT cache what the routing can pick for the "
                   "given shapes (--model, --router, --fused-a), else every kernel instantiation"),
    "tune": ("slim_kernel.tune", "measure the fastest path for your shapes on this GPU and route by it"),
    "audit": ("slim_kernel.audit.cli", "check wheels for retired AOT code (exit 0 clean, 1 found, 2 refused, 3 missing package, "
              "4 internal error)"),
    "size": ("slim_kernel.audit.size_cli", "report wheel size, per-op native bytes, reduction vs a baseline"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # A CPU build of torch without numpy warns "Failed to initialize NumPy" on import; slim-kernel
    # uses no numpy, so the commands keep that noise out of their output (library users keep it).
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    parser = argparse.ArgumentParser(prog="slim-kernel", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"slim-kernel {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = argv[0] if argv and argv[0] in COMMANDS else None
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_run=module.run, _internal=getattr(module, "EXIT_INTERNAL", None))
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except BrokenPipeError:  # `slim-kernel info | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit flush
        return 0
    except Exception:
        # a command whose exit codes give 1 a meaning (audit: code found) reports a crash as its
        # own code, never as 1
        if args._internal is None:
            raise
        traceback.print_exc(file=sys.stderr)
        return args._internal


if __name__ == "__main__":
    raise SystemExit(main())
