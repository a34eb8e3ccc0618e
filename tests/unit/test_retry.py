from engine.retry import Backoff


def test_delay_doubles_per_failure_in_a_row_up_to_the_cap() -> None:
    backoff = Backoff(0.1, max_s=1.0)
    assert [backoff.failed() for _ in range(6)] == [0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert backoff.failures == 6


def test_success_resets_and_says_how_many_failures_it_ends() -> None:
    backoff = Backoff(0.1)
    backoff.failed()
    backoff.failed()
    assert backoff.succeeded() == 2
    assert backoff.succeeded() == 0
    assert backoff.failed() == 0.2
