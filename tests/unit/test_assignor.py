"""The group assignor (router/assignor.py) as properties (hypothesis): every partition of the
subscribed topics has exactly one member, members are balanced within one, a join or a leave
moves the fewest partitions balance allows, and the answer depends on the inputs alone."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tailrace.router.assignor import assign

members_st = st.lists(st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=12, unique=True)
topics_st = st.dictionaries(st.sampled_from(["t1", "t2", "t3"]), st.integers(0, 40), min_size=1)


def _check_balanced(out, topics):
    everything = sorted((t, p) for t, n in topics.items() for p in range(n))
    got = sorted(tp for s in out.values() for tp in s)
    assert got == everything  # each partition exactly once
    sizes = [len(s) for s in out.values()]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=300, deadline=None)
@given(members_st, topics_st, st.data())
def test_balanced_sticky_and_deterministic_on_a_join_and_a_leave(members, topics, data):
    subs = {m: list(topics) for m in members}
    first = assign(subs, topics, {})
    _check_balanced(first, topics)
    assert assign(dict(reversed(list(subs.items()))), topics, first) == first  # nothing changes, nothing moves
    n = sum(topics.values())
    # a member joins: only what balance needs moves (the others keep min(held, new quota))
    joiner = "z" + data.draw(st.text("xyz", max_size=2))
    after = assign({**subs, joiner: list(topics)}, topics, first)
    _check_balanced(after, topics)
    moved = sum(len(first[m] - after[m]) for m in members)
    assert moved == len(after[joiner]) and len(after[joiner]) in (n // (len(members) + 1), -(-n // (len(members) + 1)))
    # a member leaves: only its partitions move
    leaver = data.draw(st.sampled_from(members))
    rest = {m: list(topics) for m in members if m != leaver}
    if rest:
        gone = assign(rest, topics, first)
        _check_balanced(gone, topics)
        assert all(first[m] <= gone[m] for m in rest)  # nobody lost anything
    # deterministic: the same inputs, the same answer
    assert assign({**subs, joiner: list(topics)}, topics, first) == after


def test_a_topic_that_grows_keeps_the_old_partitions_where_they_were():
    subs = {"a": ["t"], "b": ["t"], "c": ["t"]}
    before = assign(subs, {"t": 6}, {})
    after = assign(subs, {"t": 9}, before)
    assert all(before[m] <= after[m] for m in subs) and sorted(len(s) for s in after.values()) == [3, 3, 3]


def test_members_get_only_partitions_of_their_topics():
    out = assign({"a": ["x"], "b": ["x", "y"], "c": ["y"]}, {"x": 4, "y": 4, "gone": 3}, {})
    assert all(t == "x" for t, _p in out["a"]) and all(t == "y" for t, _p in out["c"])
    assert sorted(tp for s in out.values() for tp in s) == [(t, p) for t in ("x", "y") for p in range(4)]
