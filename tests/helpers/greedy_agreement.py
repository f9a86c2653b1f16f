"""Whether two greedy bf16 runs of one engine that differ only in a kernel disagree for a benign
reason. Two kernels that sum in other orders give logprobs a rounding apart; greedy sequences then
part where two tokens were nearly tied, and are incomparable after that. A wiring fault (wrong key
rows, stale lengths, a graph replayed on old buffers) moves logprobs by much more, usually long
before any flip. So, per request, up to the first position where the tokens differ:
- every shared position's logprob agrees within ``tol``;
- at the first differing position, each run's top logprobs hold both tokens, and the two runs'
  margins add up to at most 2 ``tol`` (if every logprob of the two runs is within ``tol``, run A's
  lead of its token plus run B's lead of its own is at most 2 ``tol``: the flip is a near-tie). Ask
  for more than 2 top logprobs: among thousands of positions of a random model, three tokens within
  a rounding of each other happen, and then one run's second token may be the third one.
"""

from __future__ import annotations


def near_tie_report(tokens_a, lps_a, tokens_b, lps_b, tol: float) -> tuple[int, float, list[str]]:
    """(first differing position or the common length, the largest logprob difference over the shared
    positions, the problems found); ``lps_*`` are ``TokenLogprob`` lists with ``top`` of at least 2."""
    n = min(len(tokens_a), len(tokens_b))
    first = next((i for i in range(n) if tokens_a[i] != tokens_b[i]), n)
    worst = max((abs(lps_a[i].logprob - lps_b[i].logprob) for i in range(first)), default=0.0)
    problems = [f"position {i}: logprob {lps_a[i].logprob:.4f} vs {lps_b[i].logprob:.4f}"
                for i in range(first) if abs(lps_a[i].logprob - lps_b[i].logprob) > tol]
    if first < n:
        ta, tb = tokens_a[first], tokens_b[first]
        top_a, top_b = dict(lps_a[first].top), dict(lps_b[first].top)
        if not {ta, tb} <= top_a.keys() or not {ta, tb} <= top_b.keys():
            problems.append(f"position {first}: tokens {ta} / {tb} are not both in each run's top "
                            f"{min(len(top_a), len(top_b))}")
        else:
            margin = (top_a[ta] - top_a[tb]) + (top_b[tb] - top_b[ta])
            if margin > 2 * tol:
                problems.append(f"position {first}: the flip is no near-tie (margins add up to {margin:.4f})")
    elif len(tokens_a) != len(tokens_b):
        problems.append(f"lengths {len(tokens_a)} vs {len(tokens_b)}")
    return first, worst, problems
