"""Practical tolerance per kind of quantity, defined once.

A measured level reproduces a document's value when that value lies within the tolerance of our
interval; arithmetic on the document's own numbers reproduces it within the tolerance. Values in
the quantity's own unit; the documents give most numbers to two or three digits.
"""

TOLERANCE = {
    "share": 0.02,       # fractions: recovery, hit / miss shares, acceptance, error shares
    "acceptance": 0.01,  # break-even acceptances (two digits)
    "speedup": 0.01,     # x (two digits)
    "experts": 0.25,     # distinct experts per window
    "slope": 0.02,
    "cosine": 0.01,
    "weight": 0.005,     # normalized gate weights (three digits)
    "count": 0.0,        # exact counts of constructed cases
    "per token": 0.5,    # counts per decode token
    "MB": 5.0,           # MB per token
    "GB/s": 0.1,
    "ms": 0.1,
    "x": 0.5,            # ratios of speeds (one digit)
}


def tolerance(kind: str) -> float:
    if kind not in TOLERANCE:
        raise ValueError(f"no tolerance for quantity kind {kind!r}; known kinds: {sorted(TOLERANCE)}")
    return TOLERANCE[kind]
