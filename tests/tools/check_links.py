#!/usr/bin/env python3
"""Every relative link of the Markdown files (README.md, docs/, each folder's README and the
other .md files under the repository, build and bundle folders aside) must point at a file
or folder that exists, and a link's #anchor into a Markdown file (or its own page) at one of
its headings, as GitHub names them: lower case, punctuation but "-" and "_" dropped, spaces
as "-", a repeated heading's name followed by -1, -2, ...

    check_links.py ROOT          # exit 1 listing each broken link as FILE:LINE: TARGET
    check_links.py --self-test   # shows the check fails on a broken link, passes without
"""
import os
import re
import sys
import tempfile

LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SKIP_DIRS = {".git", "node_modules", "gpu-bundle", "data", "runs"}
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def markdown_files(root):
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")]
        for name in sorted(files):
            if name.endswith(".md"):
                yield os.path.join(folder, name)


def lines_outside_code(path):
    """(number, line) of a Markdown file's lines outside ``` blocks."""
    with open(path, errors="replace") as f:
        in_code = False
        for number, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                in_code = not in_code
                continue
            if not in_code:
                yield number, line


def anchors(path):
    """The anchors GitHub gives a Markdown file's headings."""
    names, seen = set(), {}
    for _, line in lines_outside_code(path):
        m = HEADING.match(line)
        if not m:
            continue
        name = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(name, 0)
        seen[name] = count + 1
        names.add(name if count == 0 else f"{name}-{count}")
    return names


def broken(root):
    found = []
    known = {}  # path: its anchors
    for path in markdown_files(root):
        for number, line in lines_outside_code(path):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # a URL
                file_part, _, anchor = target.partition("#")
                linked = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                if not os.path.exists(linked):
                    found.append(f"{os.path.relpath(path, root)}:{number}: {target}")
                elif anchor and linked.endswith(".md"):
                    if linked not in known:
                        known[linked] = anchors(linked)
                    if anchor not in known[linked]:
                        found.append(f"{os.path.relpath(path, root)}:{number}: {target} (no such heading)")
    return found


def self_test():
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "docs"))
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write("# Start\n[a](docs/a.md) [b](docs/a.md#the-parts-coreab_c) [web](https://example.org) [top](#start)\n"
                    "[again](docs/a.md#part-1)\n```\n[not a link](nowhere.md)\n# not a heading\n```\n")
        with open(os.path.join(root, "docs", "a.md"), "w") as f:
            f.write("## The parts (`core/a/b_c`)\n### Part\n### Part\n[back](../README.md)\n")
        if broken(root):
            return "a tree without broken links was refused: " + "; ".join(broken(root))
        with open(os.path.join(root, "docs", "a.md"), "a") as f:
            f.write("[gone](gone.md) [up](../docs/missing.md#x) [no](../README.md#not-a-heading) [here](#part-2)\n")
        got = broken(root)
        expected = ["docs/a.md:5: gone.md", "docs/a.md:5: ../docs/missing.md#x",
                    "docs/a.md:5: ../README.md#not-a-heading (no such heading)", "docs/a.md:5: #part-2 (no such heading)"]
        if got != expected:
            return f"expected the four broken links of docs/a.md:5, got {got}"
    return None


def main():
    if sys.argv[1:] == ["--self-test"]:
        error = self_test()
        print(error or "check_links.py: the check finds broken relative links and anchors, and passes a clean tree")
        return 1 if error else 0
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    found = broken(root)
    for line in found:
        print(line)
    print(f"check_links.py: {len(found)} broken relative link(s)" if found else
          "check_links.py: every relative link of the Markdown files points at a file, and each anchor at a heading")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
