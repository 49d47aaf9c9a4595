#!/usr/bin/env python3
"""Compiles every ```cpp block of the given Markdown files against include/.

Usage: check_doc_examples.py INCLUDE_DIR FILE.md|DIR... [--run COMMSRUN LIBDIR] -- COMPILER [ARGS...]
(a DIR stands for its *.md files)

Each block becomes the body of its own function, or, when it declares things
at file scope (a plugin's extern "C" entry), a namespace of its own (its
#include lines go to the top), after a preamble declaring the names the examples take as given
(`grad`, `shard`, `init`, `train()`, ...). #line directives make the
compiler's errors point at the Markdown file. One -fsyntax-only run checks
them all; exit status 1 if any block does not compile or none was found.

With --run, every block must also say how it runs, in an HTML comment on the
line before its fence (invisible in the rendered page):
  <!-- doc-example: ranks=4 -->            a program: it runs under COMMSRUN
                                           at 4 ranks on the CPU quick start
                                           (COMMS_BACKEND=cpu:gloo)
  <!-- doc-example: not-a-program REASON --> compiled only (REASON says what
                                           runs it instead, e.g. a plugin)
A ```yaml (or other) block preceded by <!-- doc-file: NAME --> is written to
NAME in the directory the programs run in. All programs are linked into one
executable against LIBDIR's libcomms (argv[1] picks the block); a block
fails when any rank exits non-zero. The last line is
"N passed, N failed, N skipped" (for scripts/run_tests.py).

  check_doc_examples.py --python COMMSRUN PYTHON PYTHONPATH FILE.md|DIR...
runs the ```python blocks marked <!-- doc-example: ranks=N --> instead, each
as a script under COMMSRUN at N ranks with PYTHON and PYTHONPATH (the
build's package); unmarked ```python blocks are fragments and are not run.
"ranks=N needs=MODULE" skips the block, saying so, where PYTHON cannot
import MODULE (torch, on machines without it).
"""
import os
import re
import shutil
import subprocess
import tempfile
import sys

# Names the examples use without declaring them: buffers, a size, options
# from an earlier step, and the user's own training functions.
PREAMBLE = """\
#include <comms/comms.h>
#include <cstddef>
#include <cstdio>
#include <vector>

namespace doc_examples_context {
// A user's tensor: a vector that also passes as a BufferView.
struct Tensor : std::vector<float> {
  operator comms::BufferView() { return comms::BufferView::of(*this); }
};
inline std::size_t n = 16;
inline Tensor grad, grads, shard, full, embedding_grad;
inline comms::dist::InitOptions init;
inline std::vector<int> tp_ranks;
inline comms::dist::GroupOptions tp_options;
void train();
void generate();
}  // namespace doc_examples_context
using namespace doc_examples_context;
namespace dist = comms::dist;  // as the examples write it
"""

# What the examples take as given, defined for running them: buffers sized
# for the world (all_gather's output is world * its input), no-op training.
RUN_MAIN = """
#include <cstdlib>
#include <exception>
#include <string>
namespace doc_examples_context {
void train() { std::puts("train(): the user's training step"); }
void generate() { std::puts("generate(): the user's inference phase"); }
}  // namespace doc_examples_context
int main(int argc, char** argv) {
  using namespace doc_examples_context;
  const char* ws = std::getenv("WORLD_SIZE");
  const std::size_t world = ws ? std::strtoul(ws, nullptr, 10) : 1;
  for (auto* t : {&grad, &shard, &embedding_grad}) t->assign(n, 1.0f);
  full.assign(n * world, 0.0f);
  grads.assign(n * world, 1.0f);
  for (std::size_t r = 0; r < world; ++r) tp_ranks.push_back(static_cast<int>(r));
  const int which = argc > 1 ? std::atoi(argv[1]) : -1;
  try {
    switch (which) {
%s
      default: std::fprintf(stderr, "no doc example %%d\\n", which); return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "doc example %%d failed: %%s\\n", which, e.what());
    return 1;
  }
  return 0;
}
"""

ANNOTATION = re.compile(r"^<!--\s*doc-example:\s*(.*?)\s*-->\s*$")
DOC_FILE = re.compile(r"^<!--\s*doc-file:\s*(\S+)\s*-->\s*$")
ANY_FENCE = re.compile(r"^```\w*[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)

FILE_SCOPE = re.compile(r'^extern "C"', re.M)
FENCE = re.compile(r"^```cpp[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


def line_before(text, pos):
    """The line above the one starting at pos (the fence line)."""
    fence_start = text.rfind("\n", 0, pos - 1) + 1  # start of the ```cpp line
    prev_start = text.rfind("\n", 0, max(fence_start - 1, 0)) + 1
    return text[prev_start:max(fence_start - 1, prev_start)] if fence_start > 0 else ""


def blocks(path):
    text = open(path, encoding="utf-8").read()
    for m in FENCE.finditer(text):
        first_line = text.count("\n", 0, m.start(1)) + 1
        yield first_line, m.group(1)


def annotations(path):
    """(first line, how) of each cpp block: "ranks=N", "not-a-program ...", or None."""
    text = open(path, encoding="utf-8").read()
    for m in FENCE.finditer(text):
        a = ANNOTATION.match(line_before(text, m.start(1)))
        yield text.count("\n", 0, m.start(1)) + 1, a.group(1) if a else None


def doc_files(path):
    text = open(path, encoding="utf-8").read()
    for m in ANY_FENCE.finditer(text):
        f = DOC_FILE.match(line_before(text, m.start(1)))
        if f:
            yield f.group(1), m.group(1)


def translation_unit(files, keep=None):
    """The blocks as one source; `keep`: the block numbers to take (all if None)."""
    includes, bodies, count = [], [], 0
    for path in files:
        for first_line, code in blocks(path):
            count += 1
            if keep is not None and count not in keep:
                continue
            body = []
            for i, line in enumerate(code.splitlines()):
                if line.lstrip().startswith("#include"):
                    includes.append(f'#line {first_line + i} "{path}"\n{line}')
                    body.append("")  # keeps the #line numbering of what follows
                else:
                    body.append(line)
            # A block of file-scope declarations (a plugin's entry point)
            # compiles in a namespace of its own; anything else is a body.
            opener = (f"namespace doc_example_{count} {{" if FILE_SCOPE.search(code)
                      else f"void doc_example_{count}() {{")
            bodies.append(f"{opener}\n#line {first_line} \"{path}\"\n" + "\n".join(body) + "\n}\n")
    return PREAMBLE + "\n".join(includes) + "\n" + "\n".join(bodies), count


def run_examples(files, include_dir, compiler, commsrun, libdir):
    """Links every block into one program and runs each that is one."""
    plan, problems = [], []
    index = 0
    for path in files:
        for first_line, how in annotations(path):
            index += 1
            where = f"{path}:{first_line}"
            if how is None:
                problems.append(f"{where}: no <!-- doc-example: ranks=N --> (or not-a-program REASON) line above the block")
            elif how.startswith("not-a-program"):
                print(f"SKIPPED {where}: {how}")
            elif re.fullmatch(r"ranks=\d+", how):
                plan.append((index, where, int(how.split("=")[1])))
            else:
                problems.append(f"{where}: cannot read the annotation '{how}'")
    for p in problems:
        print(f"FAILED {p}", file=sys.stderr)
    cases = "\n".join(f"      case {i}: doc_example_{i}(); break;" for i, _, _ in plan)
    workdir = tempfile.mkdtemp(prefix="comms-doc-examples-")
    try:
        for path in files:
            for name, content in doc_files(path):
                with open(os.path.join(workdir, name), "w", encoding="utf-8") as f:
                    f.write(content)
        exe = os.path.join(workdir, "doc_examples")
        cmd = compiler + ["-std=c++20", "-I", include_dir, "-x", "c++", "-", "-x", "none", "-o", exe,
                          "-L", libdir, "-lcomms", f"-Wl,-rpath,{os.path.abspath(libdir)}"]
        source, _ = translation_unit(files, keep={i for i, _, _ in plan})
        built = subprocess.run(cmd, input=source + RUN_MAIN % cases, text=True, capture_output=True, timeout=300)
        sys.stderr.write(built.stderr)
        if built.returncode != 0:
            print("FAILED: the examples do not link into a program (see above)", file=sys.stderr)
            print(f"0 passed, {len(plan) + len(problems)} failed, 0 skipped")
            return 1
        passed, failed = 0, len(problems)
        env = dict(os.environ, COMMS_BACKEND="cpu:gloo", COMMS_OP_TIMEOUT="60s", COMMS_INIT_TIMEOUT="60s")
        for i, where, ranks in plan:
            if run_under_commsrun(commsrun, ranks, [exe, str(i)], where, workdir, env):
                passed += 1
            else:
                failed += 1
        skipped = index - len(plan) - len(problems)
        print(f"{passed} passed, {failed} failed, {skipped} skipped")
        return 0 if failed == 0 else 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_under_commsrun(commsrun, ranks, argv, where, workdir, env):
    """Runs argv at `ranks` ranks; prints PASSED, or FAILED with its output. True when it passed."""
    run = subprocess.run([os.path.abspath(commsrun), "-n", str(ranks), "--timeout", "150", "--"] + argv,
                         cwd=workdir, env=env, text=True, capture_output=True, timeout=180)
    if run.returncode == 0:
        print(f"PASSED {where} at {ranks} ranks")
        return True
    print(f"FAILED {where} at {ranks} ranks (exit {run.returncode}):\n{run.stdout}{run.stderr}", file=sys.stderr)
    return False


PY_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
PY_HOW = re.compile(r"ranks=(\d+)(?:\s+needs=(\S+))?$")


def python_blocks(path):
    """(first line, how, code) of each ```python block marked as a program."""
    text = open(path, encoding="utf-8").read()
    for m in PY_FENCE.finditer(text):
        a = ANNOTATION.match(line_before(text, m.start(1)))
        if a:
            yield text.count("\n", 0, m.start(1)) + 1, a.group(1), m.group(1)


def run_python_examples(commsrun, python, pythonpath, files):
    """Runs each marked ```python block as a script under commsrun."""
    passed = failed = skipped = 0
    env = dict(os.environ, COMMS_BACKEND="cpu:gloo", COMMS_OP_TIMEOUT="60s", COMMS_INIT_TIMEOUT="60s",
               PYTHONPATH=os.path.abspath(pythonpath))
    workdir = tempfile.mkdtemp(prefix="comms-doc-python-")
    try:
        for path in files:
            for first_line, how, code in python_blocks(path):
                where = f"{path}:{first_line}"
                m = PY_HOW.fullmatch(how)
                if not m:
                    failed += 1
                    print(f"FAILED {where}: cannot read the annotation '{how}'", file=sys.stderr)
                    continue
                ranks, needs = int(m.group(1)), m.group(2)
                if needs and subprocess.run([python, "-c", f"import {needs}"], env=env,
                                            capture_output=True).returncode != 0:
                    skipped += 1
                    print(f"SKIPPED {where}: {python} cannot import {needs}")
                    continue
                script = os.path.join(workdir, f"example_{first_line}.py")
                with open(script, "w", encoding="utf-8") as f:
                    f.write(code)
                if run_under_commsrun(commsrun, ranks, [python, script], where, workdir, env):
                    passed += 1
                else:
                    failed += 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed or passed + skipped == 0 else 0


def md_files(args):
    files = []
    for arg in args:
        if os.path.isdir(arg):
            files += sorted(os.path.join(arg, f) for f in os.listdir(arg) if f.endswith(".md"))
        else:
            files.append(arg)
    return files


def main(argv):
    if len(argv) > 5 and argv[1] == "--python":
        return run_python_examples(argv[2], argv[3], argv[4], md_files(argv[5:]))
    if "--" not in argv or argv.index("--") < 3:
        sys.exit(__doc__)
    sep = argv.index("--")
    include_dir, compiler = argv[1], argv[sep + 1:]
    args = argv[2:sep]
    run_with = None
    if "--run" in args:
        at = args.index("--run")
        if len(args) < at + 3:
            sys.exit(__doc__)
        run_with = args[at + 1], args[at + 2]
        args = args[:at] + args[at + 3:]
    files = md_files(args)
    source, count = translation_unit(files)
    if count == 0:
        print(f"no ```cpp block in {', '.join(files)}: nothing was checked", file=sys.stderr)
        return 1
    cmd = compiler + ["-std=c++20", "-fsyntax-only", "-I", include_dir, "-x", "c++", "-"]
    result = subprocess.run(cmd, input=source, text=True, capture_output=True, timeout=120)
    sys.stderr.write(result.stderr)
    if result.returncode != 0:
        print(f"FAILED: a C++ example of {', '.join(files)} does not compile (see above)", file=sys.stderr)
        return 1
    print(f"{count} C++ examples of {', '.join(files)} compile")
    if run_with:
        return run_examples(files, include_dir, compiler, *run_with)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
