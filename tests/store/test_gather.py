"""L{authsrv.pg.gather}: which lookups go alone, which together, and what each one hears back."""

from __future__ import annotations

from twisted.internet.defer import CancelledError, Deferred, fail
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from authsrv.pg.gather import Gather

PENDING = object()


class Database:
    """Statements held until the test answers them, in the order they were sent."""

    def __init__(self):
        self.sent: list[tuple[str, object, object, Deferred]] = []

    def run(self, work) -> Deferred:
        return Deferred.fromCoroutine(work(self))

    async def one(self, db, key, shared):
        return await self._held(("one", key, shared))

    async def many(self, db, keys, shared):
        return await self._held(("many", keys, shared))

    def _held(self, what) -> Deferred:
        reply: Deferred = Deferred()
        self.sent.append((*what, reply))
        return reply

    def answer(self, index: int, value) -> None:
        self.sent[index][3].callback(value)

    def asked(self) -> list[tuple]:
        return [sent[:3] for sent in self.sent]


def gather(database: Database, clock: Clock, width: int = 2) -> Gather:
    return Gather(clock, database.run, database.one, database.many, width=width)


def results(deferreds: list[Deferred]) -> list:
    """What each of C{deferreds} fired with, in their order (L{PENDING} until it fires)."""
    out = [PENDING] * len(deferreds)
    for index, d in enumerate(deferreds):
        d.addBoth(lambda result, i=index: out.__setitem__(i, result))
    return out


def test_a_lone_lookup_goes_at_once_and_alone():
    database, clock = Database(), Clock()
    lookups = gather(database, clock)
    heard = results([lookups("a", 1)])
    assert database.asked() == [("one", "a", 1)]
    database.answer(0, "record a")
    assert heard == ["record a"]
    clock.advance(0)
    assert database.asked() == [("one", "a", 1)]


def test_lookups_of_one_turn_after_the_first_go_together_at_its_end():
    database, clock = Database(), Clock()
    lookups = gather(database, clock)
    heard = results([lookups(key, 1) for key in ("a", "b", "c", "b")])
    assert database.asked() == [("one", "a", 1)]
    clock.advance(0)
    assert database.asked()[1:] == [("many", ["b", "c"], 1)]
    database.answer(1, {"b": "record b"})
    database.answer(0, "record a")
    assert heard == ["record a", "record b", None, "record b"]
    results([lookups("d", 1)])
    assert database.asked()[2:] == [("one", "d", 1)]


def test_a_waiting_group_of_one_key_goes_as_a_lone_lookup():
    """The statement for one key, as a lone request's: its plan, its prepared name."""
    database, clock = Database(), Clock()
    lookups = gather(database, clock)
    heard = results([lookups(key, 1) for key in ("a", "b", "b")])
    clock.advance(0)
    assert database.asked() == [("one", "a", 1), ("one", "b", 1)]
    database.answer(1, "record b")
    database.answer(0, None)
    assert heard == [None, "record b", "record b"]


def test_lookups_waiting_for_the_turns_end_go_when_a_statement_comes_back_first():
    database, clock = Database(), Clock()
    lookups = gather(database, clock)
    heard = results([lookups(key, 1) for key in ("a", "b", "c")])
    database.answer(0, "record a")
    assert database.asked()[1:] == [("many", ["b", "c"], 1)]
    database.answer(1, {"c": "record c"})
    assert heard == ["record a", None, "record c"]
    clock.advance(0)
    assert len(database.sent) == 2


def test_a_lookup_answered_at_once_leaves_the_rest_of_its_turn_to_gather():
    """Where the database shares the core, a reply can be read before the next request is."""
    clock, sent = Clock(), []

    async def one(db, key, shared):
        sent.append(("one", key))
        return key.upper()

    async def many(db, keys, shared):
        sent.append(("many", keys))
        return {key: key.upper() for key in keys}

    lookups = Gather(clock, lambda work: Deferred.fromCoroutine(work(None)), one, many)
    heard = results([lookups(key, 1) for key in ("a", "b", "c")])
    assert sent == [("one", "a")]
    clock.advance(0)
    assert sent == [("one", "a"), ("many", ["b", "c"])]
    assert heard == ["A", "B", "C"]


def test_beyond_the_width_lookups_wait_for_a_statement_to_come_back():
    database, clock = Database(), Clock()
    lookups = gather(database, clock, width=2)
    results([lookups("a", 1)])
    clock.advance(0)
    results([lookups("b", 1)])
    clock.advance(0)
    heard = results([lookups(key, 1) for key in ("c", "d")])
    assert database.asked() == [("one", "a", 1), ("one", "b", 1)]
    clock.advance(0)
    assert len(database.sent) == 2
    database.answer(1, "record b")
    assert database.asked()[2:] == [("many", ["c", "d"], 1)]
    database.answer(2, {"c": "record c", "d": "record d"})
    assert heard == ["record c", "record d"]


def test_lookups_go_together_only_with_the_same_shared_parameters():
    database, clock = Database(), Clock()
    lookups = gather(database, clock, width=3)
    heard = results([lookups("a", 1), lookups("b", 2), lookups("c", 1), lookups("d", 2)])
    clock.advance(0)
    assert database.asked()[1:] == [("many", ["b", "d"], 2), ("one", "c", 1)]
    database.answer(0, "a at 1")
    database.answer(1, {"b": "b at 2", "d": "d at 2"})
    database.answer(2, "c at 1")
    assert heard == ["a at 1", "b at 2", "c at 1", "d at 2"]


def test_no_more_than_the_width_is_ever_under_way():
    database, clock = Database(), Clock()
    lookups = gather(database, clock, width=2)
    heard = results([lookups(key, shared) for shared in (1, 2, 3) for key in ("a", "b")])
    clock.advance(0)
    while outstanding := [sent for sent in database.sent if not sent[3].called]:
        assert len(outstanding) <= 2
        kind, keys, _, reply = outstanding[0]
        reply.callback({key: key for key in keys} if kind == "many" else keys)
    assert database.asked() == [
        ("one", "a", 1), ("one", "b", 1), ("many", ["a", "b"], 2), ("many", ["a", "b"], 3)]
    assert heard == ["a", "b"] * 3


def test_a_failed_statement_fails_every_lookup_that_went_with_it_and_the_rest_carry_on():
    database, clock = Database(), Clock()
    lookups = gather(database, clock, width=1)
    heard = results([lookups("a", 1), lookups("b", 1), lookups("c", 1), lookups("d", 2)])
    database.answer(0, "record a")
    database.sent[1][3].errback(Failure(ConnectionError("the database went away")))
    database.answer(2, "record d")
    assert heard[0] == "record a" and heard[3] == "record d"
    assert [each.value.args for each in heard[1:3]] == [("the database went away",)] * 2


def test_a_lookup_given_up_while_it_waited_does_not_disturb_the_others():
    database, clock = Database(), Clock()
    lookups = gather(database, clock, width=1)
    first, waiting, other = lookups("a", 1), lookups("b", 1), lookups("c", 1)
    heard = results([first, other])
    waiting.addErrback(lambda failure: failure.trap(CancelledError))
    waiting.cancel()
    database.answer(0, "record a")
    database.answer(1, {"b": "record b", "c": "record c"})
    assert heard == ["record a", "record c"]


def test_a_statement_refused_at_once_frees_its_place():
    database, clock = Database(), Clock()
    refusals = [Failure(ConnectionRefusedError())]

    def run(work):
        return fail(refusals.pop()) if refusals else database.run(work)

    lookups = Gather(clock, run, database.one, database.many, width=1)
    heard = results([lookups("a", 1)])
    assert heard[0].check(ConnectionRefusedError)
    clock.advance(0)
    results([lookups("b", 1)])
    assert database.asked() == [("one", "b", 1)]
