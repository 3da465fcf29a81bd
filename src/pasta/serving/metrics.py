"""The server's Prometheus metrics (GET /metrics, text format), kept in a registry of their own per server.

prometheus-client gives the exposition format, histograms and thread-safe counters the way every Prometheus
scraper expects them; a registry per server (not the process-global one) lets tests run several servers in one
process. Live values (requests, threads, queue, cache) are read from the engine when scraped. The step metrics are
the step loop's own timing record (pasta.decoding.timing.StepTiming): a step is plan, pack, forward, choose and
commit; its host part is plan, pack and commit. The rows, requests and attended slots of the steps are what the
cost model (pasta.decoding.cost_model) prices a run's steps from: its terms add, so these distributions and the
slots' total are all it needs (scripts/bench_serve.py reads them back with `read_engine_metrics`).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

STEP_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
SPEEDUP_BUCKETS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0)
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
HOST_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
# Every row count up to 64 its own bucket (decode steps: what a step costs grows with them), then coarser ones for
# the steps that carry a prompt; every request count up to 64 its own bucket.
STEP_ROWS_BUCKETS = (*range(1, 65), 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096)
STEP_REQUESTS_BUCKETS = (*range(1, 65), 96, 128, 256)
# The histograms the cost model prices a run's steps from, and the counter of their attended slots.
ENGINE_HISTOGRAMS = ("pasta_step_rows", "pasta_step_requests", "pasta_step_seconds", "pasta_step_host_seconds")
ENGINE_COUNTERS = ("pasta_step_slots", "pasta_forward_steps")


class ServingMetrics:
    """Counters and histograms the engine and the API update; gauges read on scrape."""

    def __init__(self):
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter("pasta_requests", "HTTP requests answered, by status code (429 = rejected, "
                                "499 = client disconnected)", ["status"], registry=registry)
        self.prompt_tokens = Counter("pasta_prompt_tokens", "prompt tokens of finished sequences",
                                     registry=registry)
        self.generation_tokens = Counter("pasta_generation_tokens", "tokens sampled by finished sequences, "
                                         "every thread", registry=registry)
        self.forward_steps = Counter("pasta_forward_steps", "forward passes of the engine", registry=registry)
        self.sequences = Counter("pasta_sequences", "sequences the engine ended, by outcome "
                                 "(finished, failed, cancelled)", ["outcome"], registry=registry)
        self.step_seconds = Histogram("pasta_step_seconds", "one step: plan, pack, forward, choose, commit",
                                      buckets=STEP_BUCKETS, registry=registry)
        self.step_host_seconds = Histogram("pasta_step_host_seconds", "one step's host work: plan, pack, commit",
                                           buckets=HOST_BUCKETS, registry=registry)
        self.step_rows = Histogram("pasta_step_rows", "rows one forward fed, every request's together",
                                   buckets=STEP_ROWS_BUCKETS, registry=registry)
        self.step_requests = Histogram("pasta_step_requests", "requests in one forward",
                                       buckets=STEP_REQUESTS_BUCKETS, registry=registry)
        self.step_slots = Counter("pasta_step_slots", "cache slots the forwards attended, every request's own "
                                  "summed", registry=registry)
        self.theoretical_speedup = Histogram("pasta_theoretical_speedup", "tokens per forward step of each "
                                             "finished sequence", buckets=SPEEDUP_BUCKETS, registry=registry)
        self.sequence_seconds = Histogram("pasta_sequence_seconds", "arrival to last token of each finished "
                                          "sequence", buckets=LATENCY_BUCKETS, registry=registry)

    def watch(self, live_requests: Callable[[], int], live_threads: Callable[[], int],
              queue_depth: Callable[[], int], tokens_in_flight: Callable[[], int],
              kv_cache_bytes: Callable[[], int]) -> None:
        """Gauges read from the engine at scrape time."""
        for name, help_text, read in (
            ("pasta_live_requests", "sequences in the running batch", live_requests),
            ("pasta_live_threads", "threads decoding now: each live sequence's main thread and its running "
             "chunks", live_threads),
            ("pasta_queue_depth", "sequences waiting for admission", queue_depth),
            ("pasta_tokens_in_flight", "admission tokens held by running sequences", tokens_in_flight),
            ("pasta_kv_cache_bytes", "memory of the running batch's KV cache", kv_cache_bytes),
        ):
            Gauge(name, help_text, registry=self.registry).set_function(read)


def read_engine_metrics(text: str) -> dict[str, dict]:
    """The step metrics of a /metrics page (Prometheus text): each histogram of ENGINE_HISTOGRAMS as {bucket bound,
    'sum', 'count': value}, each counter of ENGINE_COUNTERS as {'total': value}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict] = {name: {} for name in (*ENGINE_HISTOGRAMS, *ENGINE_COUNTERS)}
    for family in text_string_to_metric_families(text):
        if family.name not in out:
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                out[family.name][float(sample.labels["le"])] = sample.value
            elif sample.name.endswith(("_sum", "_count", "_total")):
                out[family.name][sample.name.rsplit("_", 1)[1]] = sample.value
    return out


def bucket_counts(histogram: dict) -> list[tuple[int, int]]:
    """(value, number of observations) from a histogram's cumulative buckets (`read_engine_metrics`). A bucket of
    width one is exact; a coarser bucket (lo, hi] counts its observations at lo + 1, the least they can have been
    (priced on a cost that grows with them, a bound stays a bound)."""
    bounds = sorted(b for b in histogram if isinstance(b, float) and b != float("inf"))
    counts, previous, lower = [], 0.0, 0
    for bound in bounds:
        num = int(round(histogram[bound] - previous))
        if num:
            counts.append((lower + 1, num))
        previous, lower = histogram[bound], int(bound)
    return counts
