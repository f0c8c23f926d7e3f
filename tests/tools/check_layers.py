#!/usr/bin/env python3
"""The layering of megabatch's sources: every #include "..." of a file under core/, models/,
sweeps/ or apps/ must name a file of its own layer or a lower one. The layers, lowest first
(one line, one layer; folders on a line may include each other):

    util; config, data, device; tensor; comm; ops; nn; optim; io; train; models, sweeps; apps

core/<folder>/ is layer <folder>; models/, sweeps/ and apps/ are theirs. A file in a folder
that is not in the list fails too: a new folder takes its place in LAYERS first.

    check_layers.py ROOT            # the tree at ROOT; exit 1 listing every upward include
    check_layers.py --self-test     # shows the check fails on an upward include, passes without
"""
import os
import re
import sys
import tempfile

LAYERS = [["util"], ["config", "data", "device"], ["tensor"], ["comm"], ["ops"], ["nn"], ["optim"], ["io"],
          ["train"], ["models", "sweeps"], ["apps"]]
RANK = {name: i for i, line in enumerate(LAYERS) for name in line}
TOPS = ("core", "models", "sweeps", "apps")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE = re.compile(r"\.(h|hpp|cc|cpp|cu|cuh|inc)$")


def layer_of(path):
    """The layer of a repository-relative path, or None for one outside the layered tops."""
    parts = path.split("/")
    if parts[0] == "core":
        return parts[1] if len(parts) > 2 else None
    return parts[0] if parts[0] in TOPS else None


def problems(root):
    found = []
    for top in TOPS:
        for folder, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not SOURCE.search(name):
                    continue
                path = os.path.relpath(os.path.join(folder, name), root)
                mine = layer_of(path)
                if mine not in RANK:
                    found.append(f"{path}: folder '{mine}' is in no layer (add it to LAYERS in tests/tools/check_layers.py)")
                    continue
                with open(os.path.join(root, path), errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        theirs = layer_of(m.group(1))
                        if theirs in RANK and RANK[theirs] > RANK[mine]:
                            found.append(f"{path}:{number}: includes {m.group(1)} ({theirs}), a layer above {mine}")
    return found


def self_test():
    with tempfile.TemporaryDirectory() as root:
        def write(path, text):
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        write("core/ops/a.h", '#include "core/tensor/t.h"\n#include "core/util/u.h"\n')
        write("core/tensor/t.h", "")
        write("apps/main.cc", '#include "models/m.h"\n#include "core/ops/a.h"\n')
        if problems(root):
            return "a tree without upward includes was refused: " + "; ".join(problems(root))
        write("core/tensor/t.h", '#include "core/ops/a.h"\n')
        write("core/train/x.cc", '#include "models/m.h"\n')
        write("core/gadgets/y.h", "")
        got = problems(root)
        want = ["core/tensor/t.h:1", "core/train/x.cc:1", "core/gadgets/y.h"]
        missed = [w for w in want if not any(p.startswith(w) for p in got)]
        if missed or len(got) != len(want):
            return f"expected {want}, got {got}"
    return None


def main():
    if sys.argv[1:] == ["--self-test"]:
        error = self_test()
        print(error or "check_layers.py: the check finds upward includes and unlisted folders, and passes a clean tree")
        return 1 if error else 0
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    found = problems(root)
    for p in found:
        print(p)
    if found:
        print(f"check_layers.py: {len(found)} include(s) against the layering (lowest first: "
              + "; ".join(", ".join(line) for line in LAYERS) + ")")
        return 1
    print("check_layers.py: every include of core/, models/, sweeps/ and apps/ names its own layer or a lower one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
