"""The live views' flush tick: a tick renders only the changes announced before it, so that every page of a
process shares the first page's read (core.live_views.LiveConsumer._due)."""
from core.live_views import LiveConsumer, Need


def consumer_with(dirty: dict) -> LiveConsumer:
    consumer = LiveConsumer.__new__(LiveConsumer)  # no socket: only the bookkeeping is under test
    consumer.dirty = dirty
    return consumer


def test_a_tick_takes_the_changes_announced_before_it_and_leaves_the_later_ones_for_the_next():
    before, at, after, resync_only = Need(since=9.95), Need(since=10.0), Need(since=10.003), Need(version=42)
    consumer = consumer_with({("host", 1): before, ("host", 2): at, ("host", 3): after, ("counts",): resync_only})
    now, later = consumer._due(10.0)
    assert now == {("host", 1): before, ("host", 2): at, ("counts",): resync_only}
    assert later == {("host", 3): after}


def test_a_flush_without_a_tick_takes_everything():
    dirty = {("host", 1): Need(since=1e12)}
    assert consumer_with(dirty)._due(None) == (dirty, {})


def test_cards_wait_for_the_common_clock_while_rows_go_at_every_tick(settings):
    settings.CONSOLE_LIVE_CARDS_S = 1.0
    consumer = consumer_with({})
    consumer.card_kinds = frozenset({"counts"})
    consumer.dirty = {("counts",): Need(since=9.95), ("host", 1): Need(since=9.95)}
    now, consumer.dirty = consumer._due(10.0)  # no card sent yet: it goes at once
    assert set(now) == {("counts",), ("host", 1)}
    for tick in (10.1, 10.5, 10.9):  # moves stream in: the rows go, the card waits for the next second
        consumer.dirty.update({("counts",): Need(since=tick - 0.05), ("host", 1): Need(since=tick - 0.05)})
        now, consumer.dirty = consumer._due(tick)
        assert set(now) == {("host", 1)} and set(consumer.dirty) == {("counts",)}
    consumer.dirty[("host", 1)] = Need(since=10.95)
    now, consumer.dirty = consumer._due(11.0)  # every page of the process crosses it at this tick: one read for all
    assert set(now) == {("counts",), ("host", 1)} and consumer.dirty == {}
