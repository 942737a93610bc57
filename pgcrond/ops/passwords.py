"""``pgcrond hash-password``: the hash a status page user's config entry holds.

The password is read from the terminal (twice, not echoed) or, with
``--stdin``, from the first line of stdin, so that it never appears in a
command line, a shell history or the config.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from pgcrond.core.passwords import hash_password
from pgcrond.errors import ExitCode

# Shorter is guessed offline from a leaked config in no time, scrypt or not.
MIN_LENGTH = 8


def hash_password_command(args: argparse.Namespace) -> int:
    if args.stdin:
        password = sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    else:
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            print("error: the two passwords differ; nothing printed", file=sys.stderr)
            return ExitCode.ERROR
    if len(password) < MIN_LENGTH:
        print(
            f"error: a password needs at least {MIN_LENGTH} characters; nothing printed",
            file=sys.stderr,
        )
        return ExitCode.ERROR
    print(hash_password(password))
    return ExitCode.OK
