"""Independent reference for BERT WordPiece ids, written from the algorithm's description
(Devlin et al. 2019; Google's BERT tokenization): clean text, split CJK ideographs,
whitespace split, lower-case + NFD accent stripping (uncased), punctuation split, greedy
longest-match-first WordPiece with "##" continuations, [UNK] above 200 characters (Google BERT's max_input_chars_per_word).
Python's own unicodedata supplies the character classes, so this also cross-checks the
Unicode tables the C++ side generated from Node.js.

usage: bert_wordpiece.py VOCAB_TXT (lower|case) INPUT.jsonl OUTPUT.jsonl
"""
import json
import sys
import unicodedata


def char_class(ch):
    return unicodedata.category(ch)


def is_ws(ch):
    return ch in " \t\n\r" or char_class(ch) == "Zs"


def is_ctrl(ch):
    return ch not in "\t\n\r" and char_class(ch) in ("Cc", "Cf")


def is_punc(ch):
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return char_class(ch).startswith("P")


CJK = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
       (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)]


def words(text, lower):
    cleaned = []
    for ch in text:
        if ord(ch) in (0, 0xFFFD) or is_ctrl(ch):
            continue
        if is_ws(ch):
            cleaned.append(" ")
        elif any(a <= ord(ch) <= b for a, b in CJK):
            cleaned.append(" " + ch + " ")
        else:
            cleaned.append(ch)
    out = []
    for tok in "".join(cleaned).split():
        if lower:
            tok = "".join(c for c in unicodedata.normalize("NFD", tok.lower())
                          if char_class(c) != "Mn")
        cur = ""
        for ch in tok:
            if is_punc(ch):
                if cur:
                    out.append(cur)
                out.append(ch)
                cur = ""
            else:
                cur += ch
        if cur:
            out.append(cur)
    return out


def wordpiece(word, vocab):
    if len(word) > 200:
        return [vocab["[UNK]"]]
    ids, start = [], 0
    while start < len(word):
        end = len(word)
        while end > start:
            piece = ("##" if start > 0 else "") + word[start:end]
            if piece in vocab:
                break
            end -= 1
        else:
            return [vocab["[UNK]"]]
        ids.append(vocab[piece])
        start = end
    return ids


def main():
    vocab_path, mode, inp, outp = sys.argv[1:5]
    with open(vocab_path, encoding="utf-8") as f:
        vocab = {line.strip(): i for i, line in enumerate(f)}
    with open(inp, encoding="utf-8") as f, open(outp, "w", encoding="utf-8") as g:
        for line in f:
            text = json.loads(line)
            ids = [i for w in words(text, mode == "lower") for i in wordpiece(w, vocab)]
            g.write(json.dumps(ids) + "\n")


if __name__ == "__main__":
    main()
