"""What the three commands (coacto, coacto-server, coacto-client) share: --version, one meaning
per exit code, usage errors, rates parsed and echoed, warnings for flags a mode ignores."""
from __future__ import annotations

import argparse
import sys
import textwrap

from ._version import __version__
from .errors import CoactoError

#: Exit codes, the same in every command.
EXIT_OK = 0
EXIT_ERROR = 1     # the command could not do its work: a missing file, a bad model, a failed bind
EXIT_USAGE = 2     # a flag's value or combination is wrong (argparse's own errors exit 2 as well)
EXIT_MISMATCH = 3  # outputs disagree with onnxruntime beyond the relative 1e-4 bound


class UsageError(CoactoError):
    """A flag's value or combination is wrong; the command exits EXIT_USAGE."""


def version_text(prog: str, protocol: bool = False) -> str:
    """``coacto 0.1.0``; with protocol, the wire protocol version too (a client and a server
    speak to each other only when it is the same)."""
    if not protocol:
        return f"{prog} {__version__}"
    from .protocol import PROTOCOL_VERSION

    return f"{prog} {__version__} (protocol {PROTOCOL_VERSION})"


def add_version(parser: argparse.ArgumentParser, prog: str, protocol: bool = False) -> None:
    parser.add_argument("--version", action="version", version=version_text(prog, protocol),
                        help="print the version and exit")


def usage_error(prog: str, error: Exception, command: str | None = None) -> int:
    """Prints a usage error the way argparse does and returns EXIT_USAGE."""
    print(f"{prog}: error: {error} (see {command or prog} --help)", file=sys.stderr)
    return EXIT_USAGE


def warn(prog: str, message: str) -> None:
    """A warning the user must see whatever the log level: on stderr, named after the command."""
    print(f"{prog}: warning: {message}", file=sys.stderr, flush=True)


def warn_ignored(prog: str, flags: list[str], why: str) -> None:
    """One line per flag a mode does not use, so a flag given never goes unread without a word."""
    for flag in flags:
        warn(prog, f"{flag} is ignored {why}")


def rate_schedule(text: str, flag: str = "--bandwidth") -> list[tuple[float, float]]:
    """A --bandwidth value -> parse_schedule's steps; a bad value is a usage error."""
    from .mobile.shaper import RateError, parse_schedule

    try:
        return parse_schedule(text)
    except RateError as e:
        raise UsageError(f"{flag}: {e}") from None


def positive(value, flag: str, minimum: float = 1) -> None:
    """A count or a duration that must be at least ``minimum`` when given."""
    if value is not None and not value >= minimum:
        raise UsageError(f"{flag} must be at least {minimum:g}, got {value:g}")


EXIT_CODES_HELP = ("exit codes: 0 success, 1 an error (a file, the model, the server; message on "
                   "stderr), 2 bad usage (a flag's value or combination)")


def exit_codes_help(more: str = "", width: int = 79) -> str:
    """The exit-code paragraph of an epilog, with a command's own codes appended."""
    return textwrap.fill(EXIT_CODES_HELP + (", " + more if more else ""), width)

RATE_HELP = ("RATE: bits per second as 20mbit or 20Mbit/s (kbit, Mbit, Gbit, Kibit, ...: any "
             "case), bytes per second as 2.5MB/s or 2.5MByte/s (kB/s, MiB/s, ...). Refused, "
             "because readers differ on them: Mbps, mbps, MBps (networking reads Mbps as bits, tc "
             "reads mbps as bytes) and Mb/s (bits or bytes by the case of one letter). The rate "
             "read is echoed in both units at start.")
