#!/usr/bin/env python3
"""Checks every relative link of the given Markdown files.

Usage: check_doc_links.py ROOT FILE.md|DIR...   (a DIR stands for its *.md files)

A link `[text](path)`, `[text](path#anchor)`, `[text](#anchor)` or a
reference definition `[name]: path` must point to a file or folder that
exists (relative to the page that holds it), and its anchor, when it has
one and points into a Markdown file, to a heading of that file, spelled as
GitHub spells heading anchors. Links with a scheme (https:, mailto:) are not
followed; links inside code (fenced blocks and `spans`) are not links. A
link may not leave ROOT (the repository). Every broken link is printed as
FILE:LINE; the last line is "N passed, N failed, N skipped" (one case per
page, for scripts/run_tests.py), and the exit status is 1 if any link is broken.
"""
import os
import re
import sys

FENCE = re.compile(r"^(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def lines_outside_fences(text):
    """(line number, line) of every line outside fenced code blocks."""
    in_fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line.lstrip())
        if m:
            if in_fence is None:
                in_fence = m.group(1)
            elif m.group(1) == in_fence:
                in_fence = None
            continue
        if in_fence is None:
            yield number, line


def prose_lines(text):
    """(line number, line) of every line outside fenced code, code spans blanked."""
    for number, line in lines_outside_fences(text):
        yield number, CODE_SPAN.sub(lambda s: " " * len(s.group(0)), line)


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


_ANCHORS = {}


def anchors(path):
    if path not in _ANCHORS:
        found, seen = set(), {}
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for _, line in lines_outside_fences(text):
            h = HEADING.match(line)
            if h:
                base = slug(h.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        _ANCHORS[path] = found
    return _ANCHORS[path]


def links(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for number, line in prose_lines(text):
        for m in INLINE.finditer(line):
            yield number, m.group(1)
        r = REFERENCE.match(line)
        if r:
            yield number, r.group(1)


def problem(page, target, root):
    """Why `target` (a link on `page`) is broken, or None."""
    if SCHEME.match(target) or target.startswith("//"):
        return None
    file_part, _, anchor = target.partition("#")
    dest = os.path.normpath(os.path.join(os.path.dirname(page), file_part)) if file_part else page
    if os.path.relpath(dest, root).startswith(".."):
        return f"{target}: leaves the repository"
    if not os.path.exists(dest):
        return f"{target}: no such file {os.path.relpath(dest, root)}"
    if anchor and dest.endswith(".md") and os.path.isfile(dest) and anchor not in anchors(dest):
        return f"{target}: {os.path.relpath(dest, root)} has no heading with the anchor #{anchor}"
    return None


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    root = os.path.abspath(argv[1])
    pages = []
    for arg in argv[2:]:
        if os.path.isdir(arg):
            pages += sorted(os.path.join(arg, f) for f in os.listdir(arg) if f.endswith(".md"))
        else:
            pages.append(arg)
    passed = failed = count = 0
    for page in pages:
        page = os.path.abspath(page)
        broken = []
        for number, target in links(page):
            count += 1
            why = problem(page, target, root)
            if why:
                broken.append(f"{os.path.relpath(page, root)}:{number}: broken link {why}")
        for b in broken:
            print(f"FAILED {b}", file=sys.stderr)
        passed, failed = passed + (not broken), failed + bool(broken)
    print(f"{count} links in {len(pages)} pages checked")
    print(f"{passed} passed, {failed} failed, 0 skipped")
    return 1 if failed or not pages else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
