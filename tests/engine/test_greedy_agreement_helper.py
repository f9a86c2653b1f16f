"""The near-tie oracle the GPU engine tests use to compare two bf16 kernels' greedy runs
(helpers/greedy_agreement.py), on hand-made runs: agreement, a near-tie flip, a flip that is no
near-tie, a drifting logprob before any flip, and a token missing from a top 2."""

from helpers.greedy_agreement import near_tie_report

from paddle_mla.sched.request import TokenLogprob


def _run(rows):
    """[(token, logprob, [(token, logprob), ...]), ...] -> (tokens, TokenLogprob list)."""
    return [t for t, _, _ in rows], [TokenLogprob(t, lp, top) for t, lp, top in rows]


A = [(5, -1.00, [(5, -1.00), (6, -2.0)]), (7, -0.50, [(7, -0.50), (8, -0.508)]), (9, -0.1, [(9, -0.1), (1, -3.0)])]


def test_identical_runs_have_no_problem():
    assert near_tie_report(*_run(A), *_run(A), tol=0.01) == (3, 0.0, [])


def test_a_near_tie_flip_is_benign():
    b = [(5, -1.004, [(5, -1.004), (6, -2.0)]), (8, -0.505, [(8, -0.505), (7, -0.507)]), (3, -0.2, [(3, -0.2)])]
    first, worst, problems = near_tie_report(*_run(A), *_run(b), tol=0.01)
    assert (first, problems) == (1, []) and abs(worst - 0.004) < 1e-9


def test_a_flip_with_wide_margins_is_a_problem():
    b = [(5, -1.0, [(5, -1.0), (6, -2.0)]), (8, -0.3, [(8, -0.3), (7, -0.6)]), (9, -0.1, [(9, -0.1)])]
    first, _, problems = near_tie_report(*_run(A), *_run(b), tol=0.01)
    assert first == 1 and len(problems) == 1 and "no near-tie" in problems[0]


def test_a_drifting_logprob_is_a_problem_before_any_flip():
    b = [(5, -1.3, [(5, -1.3), (6, -2.0)])] + A[1:]
    first, worst, problems = near_tie_report(*_run(A), *_run(b), tol=0.01)
    assert first == 3 and abs(worst - 0.3) < 1e-9 and problems == ["position 0: logprob -1.0000 vs -1.3000"]


def test_a_flip_to_a_token_outside_the_top_two_is_a_problem():
    b = [A[0], (1, -0.5, [(1, -0.5), (7, -0.51)]), A[2]]
    _, _, problems = near_tie_report(*_run(A), *_run(b), tol=0.01)
    assert problems == ["position 1: tokens 7 / 1 are not both in each run's top 2"]
