"""The `coacto` command: compile, run, bench, tune, demo, profile, keygen. This module assembles
the parser from coacto.commands (one module per family of subcommands) and runs ``main``; the
commands and helpers other code imports from coacto.cli are re-exported here.

Exit codes (coacto.cli_common): 0 success; 1 an error (message on stderr); 2 bad usage; 3 outputs
disagree with onnxruntime (run --check, bench, demo)."""
from __future__ import annotations

import argparse
import logging
import sys

from ._version import __version__
from .cli_common import UsageError, exit_codes_help, usage_error
from .commands import demo, keygen, measure, model
from .commands.demo import cmd_demo, demo_offload  # noqa: F401 (re-exported)
from .commands.keygen import cmd_keygen  # noqa: F401 (re-exported)
from .commands.measure import cmd_bench, cmd_profile, cmd_tune  # noqa: F401 (re-exported)
from .commands.model import (cmd_compile, cmd_run, format_layer_profile,  # noqa: F401
                             format_trace_summary)
from .commands.shared import (check_reference, compare_outputs, ignored_model_flags,  # noqa: F401
                              load_inputs, parse_shapes, resolve_model)
from .errors import CoactoError

log = logging.getLogger("coacto.cli")

EPILOG_MAIN = """\
examples:
  coacto demo                                   build a ResNet-50, compile, run, compare
  coacto compile model.onnx -o model.ctg        ONNX -> tile graph file
  coacto run model.onnx --input data=img.npy --threads 2
  coacto run model.ctg --random --output out.npz --json
  coacto bench resnet50 --threads 2             coacto vs onnxruntime, same threads
  coacto bench --models resnet50,vgg16,mobilenetv2 --threads 1,2
  coacto tune model.onnx --threads 2            tile counts measured for this machine
  coacto profile --name my-laptop               this machine's profile for the simulator

{exit_codes}.
""".format(exit_codes=exit_codes_help("3 outputs differ from onnxruntime (run --check, bench, "
                                     "demo)"))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="coacto", description="Run ONNX models as fine-grained tile dataflow graphs.",
        epilog=EPILOG_MAIN, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="log what coacto does")
    p.add_argument("--version", action="version", version=f"coacto {__version__}",
                   help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    # the order `coacto --help` lists them in
    model.add_compile_parser(sub)
    model.add_run_parser(sub)
    measure.add_bench_parser(sub)
    measure.add_tune_parser(sub)
    demo.add_demo_parser(sub)
    measure.add_profile_parser(sub)
    keygen.add_keygen_parser(sub)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except UsageError as e:
        return usage_error("coacto", e, f"coacto {args.command}")
    except CoactoError as e:
        print(f"coacto: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a file the command writes (--output, --trace, -o): say which and why
        where = f"{e.filename}: " if e.filename else ""
        print(f"coacto: error: {where}{e.strerror or e}; check the path and its permissions",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a run in flight was cancelled before this was raised
        print("coacto: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
