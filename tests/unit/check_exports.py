#!/usr/bin/env python3
"""Fails if libcomms.so exports a symbol of its internals.

Usage: check_exports.py LIBCOMMS_SO

libcomms is built with hidden visibility and exports what include/comms
marks COMMS_API; comms::internal, comms::str and the Impl
classes behind Comm and TcpStoreServer must stay inside it.
"""
import re
import subprocess
import sys

INTERNAL = re.compile(r"comms::(internal|str|detail|env|trace)::|comms::Comm::Impl\b|comms::TcpStoreServer::Impl\b")
# The API itself must still be there (a library exporting nothing passes
# the check above too).
REQUIRED = ["comms::new_comm(", "comms::Comm::all_reduce(", "comms::dist::init_process_group(",
            "comms::list_plugins()", "comms::explain_hints(", "comms::dump_traces()"]


def own_name(symbol):
    """The symbol without template arguments, parameters or lambda scopes: a
    std::thread state or asio handler instantiated for an internal lambda is
    the template's symbol, not the internal's."""
    out, depth = [], 0
    for c in symbol:
        if c in "<({":
            depth += 1
        elif c in ">)}":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(c)
    return "".join(out)


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__)
    out = subprocess.run(["nm", "-DC", "--defined-only", argv[1]], check=True, capture_output=True,
                         text=True).stdout
    symbols = [line.split(" ", 2)[-1] for line in out.splitlines()]
    leaked = sorted({sym for sym in symbols if INTERNAL.search(own_name(sym) + "::")})
    missing = [name for name in REQUIRED if name not in out]
    for sym in leaked:
        print(f"exported internal symbol: {sym}", file=sys.stderr)
    for name in missing:
        print(f"public API symbol not exported: {name}", file=sys.stderr)
    if leaked or missing:
        print(f"FAILED: {len(leaked)} internal symbols exported, {len(missing)} API symbols missing", file=sys.stderr)
        return 1
    print(f"libcomms exports no internal symbol; {len(REQUIRED)} API symbols checked")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
