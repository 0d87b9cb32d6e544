"""The consent answers kept for a form sent again: for a while, and never more than a bounded number."""

from authsrv.flows.answered import RecentAnswers


def test_an_answer_is_recalled_until_it_expires():
    answers = RecentAnswers(kept_for=30, most=10)
    answers.keep("a", "https://client.example/cb?code=x", "hash", "csrf", "sid", 100)
    assert answers.recall("a", 129).location == "https://client.example/cb?code=x"
    assert answers.recall("a", 130) is None and answers.recall("b", 100) is None


def test_the_oldest_answers_go_first_past_the_cap_or_their_time():
    answers = RecentAnswers(kept_for=30, most=3)
    for n in range(5):
        answers.keep(str(n), f"location {n}", None, "csrf", "sid", 100 + n)
    assert [answers.recall(str(n), 104) is not None for n in range(5)] == [False, False, True, True, True]
    answers.keep("5", "location 5", None, "csrf", "sid", 133)
    assert len(answers) == 2, "the expired ones went with the next answer kept"


def test_a_kept_session_cookie_never_shows_in_a_repr():
    answers = RecentAnswers(kept_for=30, most=3)
    answers.keep("a", "https://client.example/cb?code=x", "hash", "csrf", "sid", 100, "session-secret")
    answer = answers.recall("a", 100)
    assert answer.session == "session-secret" and "session-secret" not in repr(answer)
