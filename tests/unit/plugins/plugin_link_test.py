#!/usr/bin/env python3
"""Every plugin links with -Wl,--no-undefined, and that flag does its job.

usage: plugin_link_test.py BUILD_DIR SOURCE COMPILER... -- LINK_ARGS...

1. Every shared module named libcomms-*.so in BUILD_DIR/build.ninja links
   with -Wl,--no-undefined (a new plugin without it fails here).
2. SOURCE linked as a plugin with LINK_ARGS (the flags every plugin uses)
   fails while a symbol is undefined, naming it, and links once it is defined.
"""
import os
import re
import subprocess
import sys
import tempfile

FLAG = "-Wl,--no-undefined"
SYMBOL = "comms_test_missing_function"


def plugins_without_flag(build_dir):
    text = open(os.path.join(build_dir, "build.ninja")).read()
    found, missing = [], []
    # One block per link: "build OUT: cpp_LINKER ...", then indented variables.
    for m in re.finditer(r"^build ([^:\n]*libcomms-[^:/\n]*\.so): cpp_LINKER[^\n]*\n((?:[ \t]+[^\n]*\n)*)",
                         text, re.M):
        found.append(m.group(1))
        if FLAG not in m.group(2):
            missing.append(m.group(1))
    return found, missing


def link(compiler, args, source, extra):
    out = os.path.join(tempfile.mkdtemp(prefix="plugin_link_"), "libcomms-undefined.so")
    cmd = compiler + ["-std=c++20", "-fPIC", "-shared", "-o", out, source] + extra + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def main():
    build_dir, source = sys.argv[1], sys.argv[2]
    sep = sys.argv.index("--")
    compiler, link_args = sys.argv[3:sep], sys.argv[sep + 1:]
    failures = []

    found, missing = plugins_without_flag(build_dir)
    if not found:
        failures.append("no libcomms-*.so link found in build.ninja (has its format changed?)")
    for p in missing:
        failures.append(f"plugin {p} links without {FLAG}")
    print(f"{len(found)} plugin links checked for {FLAG}")

    if FLAG not in link_args:
        failures.append(f"the plugins' link arguments {link_args} lack {FLAG}")
    bad = link(compiler, link_args, source, [])
    if bad.returncode == 0:
        failures.append(f"a plugin with the undefined symbol {SYMBOL} linked with {link_args}")
    elif SYMBOL not in bad.stderr:
        failures.append(f"the failed link does not name {SYMBOL}:\n{bad.stderr}")
    good = link(compiler, link_args, source, ["-DDEFINE_MISSING"])
    if good.returncode != 0:
        failures.append(f"the control plugin (symbol defined) did not link:\n{good.stderr}")

    for f in failures:
        print("FAIL:", f)
    if not failures:
        print(f"ok: an undefined symbol fails the link ({bad.stderr.strip().splitlines()[0]})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
