"""
The answer a sign-in's form gave, kept a few seconds for that form sent
again. Without JavaScript a second click on "Allow" (or "Sign in", or the
second factor's "Continue", or the enrolment's "Confirm") while the client is slow to answer sends the
form twice, and the browser shows only the second answer: the first one's
code or session would be lost behind a "sign-in ended" page. The same
browser's second post gets the first one's redirect instead, with the same
code, while that code is still unused and the browser still signed in with
the session it was given for (not after a sign-out, nor to the next person
signed in on a shared computer). A sign-in's answer set a new session's
cookie, which the second post does not carry yet, so it is set again: only
for the browser whose device secret bound the form, and only while that
session is live; a confirmed enrolment's answer drops the enrolment the
browser kept, so the second one drops it too. Kept in this process only: a second post that reaches
another instance gets the ended page as before.
"""

from __future__ import annotations

from collections import OrderedDict

from attrs import field, frozen

KEPT_FOR = 30
"""Seconds an answer is kept: a double click or a slow client's, well under a code's life."""
MOST_KEPT = 10_000
"""Answers kept at most; past it the oldest go first."""


@frozen
class Answer:
    """
    A finished form's redirect, the hash of the code it carries (None for
    none), its form's token, which the form sent again must carry, the sid
    of the session it answered, which must still be the browser's (None for
    a sign-in's way on to its second factor, before any session), and the
    cookie of the new session it set, to set again, and whether it dropped the browser's
    enrolment cookie (a confirmed enrolment's answer), to drop it again.
    """

    location: str
    code_hash: str | None
    csrf_token: str
    sid: str | None
    until: int
    session: str | None = field(default=None, repr=False)
    """A bearer secret: kept out of any repr, so never logged."""
    end_enrolment: bool = False


class RecentAnswers:
    """The last answers of finished interactions, by interaction id, for L{KEPT_FOR} seconds."""

    def __init__(self, kept_for: int = KEPT_FOR, most: int = MOST_KEPT):
        self._kept: OrderedDict[str, Answer] = OrderedDict()
        self._kept_for = kept_for
        self._most = most

    def keep(self, interaction_id: str, location: str, code_hash: str | None, csrf_token: str, sid: str | None,
             now: int, session: str | None = None, end_enrolment: bool = False) -> None:
        self._kept[interaction_id] = Answer(location, code_hash, csrf_token, sid, now + self._kept_for, session,
                                            end_enrolment)
        self._kept.move_to_end(interaction_id)
        while self._kept and (len(self._kept) > self._most or next(iter(self._kept.values())).until <= now):
            self._kept.popitem(last=False)

    def __len__(self) -> int:
        return len(self._kept)

    def recall(self, interaction_id: str, now: int) -> Answer | None:
        answer = self._kept.get(interaction_id)
        return answer if answer is not None and answer.until > now else None
