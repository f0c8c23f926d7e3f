"""Independent reader/writer of Megatron-LM's MMIDIDX indexed dataset, written from the
format's specification with numpy, to check the C++ side byte for byte.

usage: megatron_index.py write PREFIX DTYPE_CODE DOCS.json   (DOCS: [[[tok, ...], ...], ...])
       megatron_index.py read PREFIX OUT.json                (writes {"dtype": code, "docs": DOCS})
"""
import json
import struct
import sys

import numpy as np

DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
MAGIC = b"MMIDIDX\x00\x00"


def write(prefix, code, docs):
    dt = DTYPES[code]
    lengths, pointers, doc_idx, offset = [], [], [0], 0
    with open(prefix + ".bin", "wb") as f:
        for doc in docs:
            for seq in doc:
                arr = np.array(seq, dtype=dt)
                f.write(arr.tobytes(order="C"))
                lengths.append(len(seq))
                pointers.append(offset)
                offset += arr.nbytes
            doc_idx.append(len(lengths))
    with open(prefix + ".idx", "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(np.array(lengths, dtype=np.int32).tobytes())
        f.write(np.array(pointers, dtype=np.int64).tobytes())
        f.write(np.array(doc_idx, dtype=np.int64).tobytes())


def read(prefix):
    buf = open(prefix + ".idx", "rb").read()
    assert buf[:9] == MAGIC, "magic"
    (version,) = struct.unpack("<Q", buf[9:17])
    assert version == 1, "version"
    code = buf[17]
    s, d = struct.unpack("<QQ", buf[18:34])
    off = 34
    lengths = np.frombuffer(buf, dtype=np.int32, count=s, offset=off)
    off += 4 * s
    pointers = np.frombuffer(buf, dtype=np.int64, count=s, offset=off)
    off += 8 * s
    doc_idx = np.frombuffer(buf, dtype=np.int64, count=d, offset=off)
    assert off + 8 * d == len(buf), "size"
    data = open(prefix + ".bin", "rb").read()
    dt = DTYPES[code]
    seqs = [np.frombuffer(data, dtype=dt, count=int(n), offset=int(p)).tolist() for n, p in zip(lengths, pointers)]
    docs = [seqs[doc_idx[i]:doc_idx[i + 1]] for i in range(d - 1)]
    return {"dtype": int(code), "docs": docs}


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], int(sys.argv[3]), json.load(open(sys.argv[4])))
    else:
        json.dump(read(sys.argv[2]), open(sys.argv[3], "w"))
