"""The comms programs as commands of an installed package.

A wheel (pip install .) carries the C++ programs in comms/bin, next to the
comms/lib they link; pip installs these functions as the console scripts
commsrun, comms-info, comms-bench, comms-trace and comms-conformance, each of
which replaces itself with its program (exec: same pid, signals and exit
status, as if the program had been run directly).
"""
import os
import sys
from pathlib import Path

NAMES = ("commsrun", "comms-info", "comms-bench", "comms-trace", "comms-conformance")


def path_of(name):
    """The program's file: comms/bin/NAME in an installed package, else the
    build tree's tools/ (PYTHONPATH=build/python)."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "bin" / name, package.parent.parent / "tools" / name):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise FileNotFoundError(f"comms: the program {name} is not in {package / 'bin'} "
                            f"(this comms was installed without its programs)")


def exec_program(name, args=None):
    path = path_of(name)
    args = sys.argv[1:] if args is None else list(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, [path] + args)


def commsrun():
    exec_program("commsrun")


def comms_info():
    exec_program("comms-info")


def comms_bench():
    exec_program("comms-bench")


def comms_trace():
    exec_program("comms-trace")


def comms_conformance():
    exec_program("comms-conformance")
