"""memopt.batch_search.largest_passing: the batch it returns passed its
check and the next one failed, from any starting guess, with few checks."""
import pytest

from memopt.batch_search import largest_passing


class Counted:
    """A check ``n <= boundary`` that records the batches asked."""

    def __init__(self, boundary):
        self.boundary, self.asked = boundary, []

    def __call__(self, n):
        self.asked.append(n)
        return n <= self.boundary


@pytest.mark.parametrize("boundary", [0, 1, 2, 7, 19, 64, 1000])
@pytest.mark.parametrize("start", [1, 2, 18, 19, 20, 64, 5000])
def test_finds_the_boundary_from_any_guess(boundary, start):
    check = Counted(boundary)
    assert largest_passing(check, start, limit=1 << 20) == boundary
    assert len(check.asked) == len(set(check.asked)), "a batch was checked twice"


def test_a_good_guess_costs_two_checks():
    check = Counted(19)
    assert largest_passing(check, 19) == 19
    assert check.asked == [19, 20]
    check = Counted(18)
    assert largest_passing(check, 19) == 18
    assert check.asked == [19, 18]


def test_limit_and_known_answers():
    assert largest_passing(Counted(100), 5, limit=30) == 30
    assert largest_passing(Counted(100), 50, limit=30) == 30
    assert largest_passing(Counted(100), 5, limit=0) == 0
    check = Counted(100)
    known = {20: False}  # e.g. the batch the caller was refused at
    assert largest_passing(check, 5, known=known) == 19
    assert 20 not in check.asked and known[19] and not known[20]


def test_a_non_monotone_check_still_gets_a_checked_figure():
    passing = {1, 2, 3, 9, 10}
    n = largest_passing(lambda b: b in passing, 6, limit=12)
    assert n in passing and n + 1 not in passing
