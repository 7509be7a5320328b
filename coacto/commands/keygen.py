"""`coacto keygen`: a CurveZMQ key pair for a server or a device (coacto.keys writes it)."""
from __future__ import annotations

import argparse

from ..cli_common import exit_codes_help


def cmd_keygen(args) -> int:
    from .. import keys

    public, secret = keys.generate(args.out, args.name, force=args.force)
    key = keys.load_public(public).decode("ascii")
    print(f"public key {key}\n  {public}  (give it to the other side)\n  {secret}  (keep it "
          f"private)")
    return 0


def add_keygen_parser(sub) -> None:
    k = sub.add_parser(
        "keygen", help="write a CurveZMQ key pair for a server or a device",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  coacto keygen --out keys/ server      # keys/server.key, keys/server.key_secret\n"
               "  coacto keygen --out keys/ phone1      # one pair per device\n"
               "then give the server keys/server.key_secret and a folder holding phone1.key\n"
               "(coacto-server --secret-key ... --allowed-keys DIR), and the device\n"
               "keys/server.key and keys/phone1.key_secret (coacto-client --server-key ...\n"
               "--client-key ...). NAME.key is public; NAME.key_secret stays where it was made\n"
               "(written with mode 0600). See docs/SECURITY.md.")
    k.add_argument("name", help="the pair's name: NAME.key and NAME.key_secret")
    k.add_argument("--out", default=".", metavar="DIR", help="folder to write to (default: here)")
    k.add_argument("--force", action="store_true", help="replace an existing pair of that name")
    k.set_defaults(func=cmd_keygen)
    k.epilog += "\n\n" + exit_codes_help()
