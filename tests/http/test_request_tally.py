"""The per-request tally behind ``microbatch_http_*``: counts by route and status, and
latency buckets as ``bisect_left`` places a value (its bound included)."""

from __future__ import annotations

from bisect import bisect_left

from hypothesis import given
from hypothesis import strategies as st

from microbatch.http.metrics import RequestCollector
from microbatch.http.request_tally import RequestTally

BOUNDS = (0.001, 0.01, 0.1, 1.0)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["/predict", "/predict/a"]),
            st.sampled_from([200, 200, 400, 503, 504]),
            st.one_of(st.sampled_from(BOUNDS), st.floats(0.0, 5.0)),
        ),
        max_size=50,
    )
)
def test_counts_and_buckets_are_those_of_a_plain_count(
    requests: list[tuple[str, int, float]],
) -> None:
    tally = RequestTally(BOUNDS)
    statuses: dict[tuple[str, int], int] = {}
    buckets: dict[str, list[int]] = {}
    for route, status, seconds in requests:
        tally.record(route, status, seconds)
        statuses[route, status] = statuses.get((route, status), 0) + 1
        buckets.setdefault(route, [0] * (len(BOUNDS) + 1))[bisect_left(BOUNDS, seconds)] += 1
    assert {
        (route, status): count
        for route, routed in tally.routes.items()
        for status, count in routed.statuses().items()
    } == statuses
    assert {route: routed.buckets for route, routed in tally.routes.items()} == buckets
    for route, routed in tally.routes.items():
        expected = sum(seconds for name, _, seconds in requests if name == route)
        assert abs(routed.seconds - expected) < 1e-9


def test_answered_counts_and_logs_where_a_log_is_set() -> None:
    tally = RequestTally(BOUNDS)
    tally.answered("/predict", 200, 0.002, "id-1", "127.0.0.1:5")
    logged: list[tuple[object, ...]] = []
    tally.access_log = lambda *line: logged.append(line)
    tally.answered("/predict", 422, 0.02, "id-2", "127.0.0.1:6")
    assert logged == [("127.0.0.1:6", "POST", "/predict", 422, 0.02, "id-2")]
    assert tally.routes["/predict"].statuses() == {200: 1, 422: 1}


def test_the_collector_snapshot_reads_the_tally() -> None:
    collector = RequestCollector()
    collector.record("/predict", 200, 0.0001)
    collector.record("/predict", 503, 100.0)
    snapshot = collector.snapshot()
    assert snapshot.statuses == {("/predict", 200): 1, ("/predict", 503): 1}
    buckets, total = snapshot.latencies["/predict"]
    assert buckets[0] == 1 and buckets[-1] == 1 and sum(buckets) == 2
    assert abs(total - 100.0001) < 1e-9
