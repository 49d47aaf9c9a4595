#!/usr/bin/env python3
"""Compiles every ```cpp block of the given Markdown files against include/.

Usage: check_doc_examples.py INCLUDE_DIR FILE.md|DIR... -- COMPILER [ARGS...]
(a DIR stands for its *.md files)

Each block becomes the body of its own function, or, when it declares things
at file scope (a plugin's extern "C" entry), a namespace of its own (its
#include lines go to the top), after a preamble declaring the names the examples take as given
(`grad`, `shard`, `init`, `train()`, ...). #line directives make the
compiler's errors point at the Markdown file. One -fsyntax-only run checks
them all; exit status 1 if any block does not compile or none was found.
"""
import os
import re
import subprocess
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

FILE_SCOPE = re.compile(r'^extern "C"', re.M)
FENCE = re.compile(r"^```cpp[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


def blocks(path):
    text = open(path, encoding="utf-8").read()
    for m in FENCE.finditer(text):
        first_line = text.count("\n", 0, m.start(1)) + 1
        yield first_line, m.group(1)


def translation_unit(files):
    includes, bodies, count = [], [], 0
    for path in files:
        for first_line, code in blocks(path):
            count += 1
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


def main(argv):
    if "--" not in argv or argv.index("--") < 3:
        sys.exit(__doc__)
    sep = argv.index("--")
    include_dir, compiler = argv[1], argv[sep + 1:]
    files = []
    for arg in argv[2:sep]:
        if os.path.isdir(arg):
            files += sorted(os.path.join(arg, f) for f in os.listdir(arg) if f.endswith(".md"))
        else:
            files.append(arg)
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
