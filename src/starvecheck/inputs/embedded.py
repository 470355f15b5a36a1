"""What starvecheck measures when the user gives no data: token lengths like Alpaca's
for `pad` without --dataset or --lengths, and English prose for `starve` and `profile`
to tokenize. Both are made here, without a download or a file of the user's, and are
the same on every run and every machine, so that runs compare.
"""

from __future__ import annotations

import numpy as np

# The embedded default: a log-normal cut to [13, 307] tokens whose median is 83 and
# mean 95, the figures published for 2,000 Alpaca samples (context 4,096, batch 32).
# mu and sigma were fitted so that 2,000 evenly spaced quantiles have exactly that
# median, mean, minimum and maximum.
ALPACA_MU = 4.428
ALPACA_SIGMA = 0.552
ALPACA_RANGE = (13, 307)
ALPACA_SAMPLES = 2000


def alpaca_like(n: int = ALPACA_SAMPLES, seed: int = 0) -> np.ndarray:
    """n token lengths from the Alpaca-like distribution: its quantiles at evenly
    spaced probabilities (the lowest and highest are the range's ends), shuffled with
    `seed`. The same on every run and every machine."""
    from statistics import NormalDist

    if n < 1:
        return np.zeros(0, np.int64)
    normal = NormalDist()
    low, high = (normal.cdf((np.log(end) - ALPACA_MU) / ALPACA_SIGMA) for end in ALPACA_RANGE)
    # inv_cdf is exact but scalar: evaluate at most 10,001 points and interpolate
    # between them for larger n (a smooth curve, rounded to whole tokens anyway).
    grid = min(n, 10_001)
    u = np.linspace(0.0, 1.0, grid) if grid > 1 else np.array([0.5])
    z = np.array([normal.inv_cdf(min(max(low + p * (high - low), 1e-15), 1 - 1e-15)) for p in u])
    q = np.exp(ALPACA_MU + ALPACA_SIGMA * z)
    if grid < n:
        q = np.interp(np.linspace(0.0, 1.0, n), u, q)
    lengths = np.rint(q).astype(np.int64)
    return lengths[np.random.RandomState(seed).permutation(n)]


def default_texts(n: int, chars: int = 2000) -> list[str]:
    """Real English prose without a download: docstrings of the standard library's
    own modules, cut into samples of about `chars` characters."""
    import ast
    import os
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
    texts: list[str] = []
    buf = ""
    for name in sorted(os.listdir(stdlib)):
        if not name.endswith(".py"):
            continue
        try:
            with open(os.path.join(stdlib, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    buf += " " + " ".join(doc.split())
                    while len(buf) >= chars:
                        texts.append(buf[:chars])
                        buf = buf[chars:]
                        if len(texts) >= n:
                            return texts
    return texts or ["starvecheck " * (chars // 12)]
