#!/usr/bin/env python3
"""kl.py - compares two model-eval "logits" answers (tests/model-eval.c):
per position the softmax of each, KL(reference || other), the top-1 agreement.
Prints "KL mean M max X top1 A/N" and exits 1 when the mean is not below the
limit. Plain Python (the GPU machine has no numpy).

    kl.py REFERENCE.txt OTHER.txt [LIMIT]
"""
import math
import sys


def read(path):
    rows = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if not parts or parts[0] == "end":
                continue
            rows.append([float(v) for v in parts[1:]])
    return rows


def softmax(row):
    m = max(row)
    e = [math.exp(v - m) for v in row]
    s = sum(e)
    return [v / s for v in e]


def main():
    ref, other = read(sys.argv[1]), read(sys.argv[2])
    limit = float(sys.argv[3]) if len(sys.argv) > 3 else 0.01
    if not ref or len(ref) != len(other):
        print("KL: %d positions against %d" % (len(ref), len(other)))
        return 1
    kls, top = [], 0
    for a, b in zip(ref, other):
        p, q = softmax(a), softmax(b)
        kls.append(sum(pi * (math.log(pi) - math.log(max(qi, 1e-30))) for pi, qi in zip(p, q) if pi > 0))
        top += a.index(max(a)) == b.index(max(b))
    mean = sum(kls) / len(kls)
    print("KL mean %.3g max %.3g top1 %d/%d" % (mean, max(kls), top, len(ref)))
    return 0 if mean < limit else 1


if __name__ == "__main__":
    sys.exit(main())
