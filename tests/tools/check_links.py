#!/usr/bin/env python3
"""Every relative link of the Markdown files (README.md, docs/, each folder's README and the
other .md files under the repository, build and bundle folders aside) must point at a file
or folder that exists; a link's #anchor is not checked.

    check_links.py ROOT          # exit 1 listing each broken link as FILE:LINE: TARGET
    check_links.py --self-test   # shows the check fails on a broken link, passes without
"""
import os
import re
import sys
import tempfile

LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SKIP_DIRS = {".git", "node_modules", "gpu-bundle", "data", "runs"}


def markdown_files(root):
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")]
        for name in sorted(files):
            if name.endswith(".md"):
                yield os.path.join(folder, name)


def broken(root):
    found = []
    for path in markdown_files(root):
        with open(path, errors="replace") as f:
            in_code = False
            for number, line in enumerate(f, 1):
                if line.lstrip().startswith("```"):
                    in_code = not in_code
                if in_code:
                    continue
                for target in LINK.findall(line):
                    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                        continue  # a URL or an anchor of this page
                    file_part = target.split("#", 1)[0]
                    if not os.path.exists(os.path.join(os.path.dirname(path), file_part)):
                        found.append(f"{os.path.relpath(path, root)}:{number}: {target}")
    return found


def self_test():
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "docs"))
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write("[a](docs/a.md) [b](docs/a.md#part) [web](https://example.org) [top](#start)\n"
                    "```\n[not a link](nowhere.md)\n```\n")
        with open(os.path.join(root, "docs", "a.md"), "w") as f:
            f.write("[back](../README.md)\n")
        if broken(root):
            return "a tree without broken links was refused: " + "; ".join(broken(root))
        with open(os.path.join(root, "docs", "a.md"), "a") as f:
            f.write("[gone](gone.md) [up](../docs/missing.md#x)\n")
        got = broken(root)
        if got != ["docs/a.md:2: gone.md", "docs/a.md:2: ../docs/missing.md#x"]:
            return f"expected the two broken links of docs/a.md:2, got {got}"
    return None


def main():
    if sys.argv[1:] == ["--self-test"]:
        error = self_test()
        print(error or "check_links.py: the check finds broken relative links and passes a clean tree")
        return 1 if error else 0
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    found = broken(root)
    for line in found:
        print(line)
    print(f"check_links.py: {len(found)} broken relative link(s)" if found else
          "check_links.py: every relative link of the Markdown files points at a file")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
