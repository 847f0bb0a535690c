#!/usr/bin/env python3
"""Checks of gatewayd in front of two real llama.cpp workers, with the official `openai` client, and
of the fleet-wide load signal from a third, llama.cpp's own server with `/metrics`.

Run by tests/real/run.sh, which starts the workers and gatewayd and passes their addresses. Every
request to gatewayd's data plane goes through a client whose response hook records `x-bch-branch`,
so the last check can compare what the client saw with gatewayd's `/metrics`.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
import uuid

import openai

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE_ADDR = "127.0.0.1:8080"  # the gateway address the examples in docs/real-workers.md use
# SmolLM2's end-of-text and end-of-turn tokens; biased away so a request runs to max_tokens and its
# duration is predictable.
NO_EOS = {"0": -100, "2": -100}
SPILL = "explicit_routing_key_spillover"
HIT = "explicit_routing_key_hit"
IMPLICIT = "implicit_routing_key_hit"

seen_lock = threading.Lock()
seen_branches: collections.Counter[str] = collections.Counter()


def record_branch(headers) -> None:
    branch = headers.get("x-bch-branch")
    if branch:
        with seen_lock:
            seen_branches[branch] += 1


# ---------------------------------------------------------------- plain HTTP


def http(method, url, body=None, headers=None, timeout=60.0, gateway=False):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if data is not None:
        request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, response_headers, raw = response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        status, response_headers, raw = error.code, error.headers, error.read()
    if gateway:
        record_branch(response_headers)
    return status, response_headers, raw


def get_json(url, **kwargs):
    status, _, raw = http("GET", url, **kwargs)
    assert status == 200, f"GET {url}: {status} {raw[:200]!r}"
    return json.loads(raw)


class Fleet:
    def __init__(self, args):
        self.gateway = args.gateway.rstrip("/")
        self.control = args.control.rstrip("/")
        self.worker_urls = [u.rstrip("/") for u in args.worker]
        workers = get_json(f"{self.control}/admin/workers")["workers"]
        self.url_of = {w["name"]: w["url"].rstrip("/") for w in workers}
        self.names = [w["name"] for w in workers]
        assert sorted(self.url_of.values()) == sorted(self.worker_urls), workers
        self.gw = self.client_with_key("bch-real-checks")
        self.direct = {
            name: openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
            for name, url in self.url_of.items()
        }
        self.model = None

    def client_with_key(self, api_key):
        """An openai client for gatewayd that records every `x-bch-branch` it gets. Its api_key
        goes out as `Authorization: Bearer ...`, the implicit routing key of requests that carry no
        X-SMG-Routing-Key. No retries: each request is one routing decision."""
        hooks = {"response": [lambda response: record_branch(response.headers)]}
        return openai.OpenAI(
            base_url=f"{self.gateway}/v1",
            api_key=api_key,
            max_retries=0,
            timeout=300,
            http_client=openai.DefaultHttpxClient(event_hooks=hooks, timeout=300),
        )

    def workers(self):
        return {w["name"]: w for w in get_json(f"{self.control}/admin/workers")["workers"]}

    def explain(self, key, explicit=True):
        query = urllib.parse.urlencode({"routing_key": key, "explicit": str(explicit).lower()})
        return get_json(f"{self.control}/admin/explain?{query}")

    def other(self, name):
        (other,) = [n for n in self.names if n != name]
        return other

    def metrics(self):
        status, _, raw = http("GET", f"{self.control}/metrics")
        assert status == 200, status
        values = {}
        for line in raw.decode().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name_labels, _, value = line.rpartition(" ")
            values[name_labels] = float(value)
        return values

    def wait_idle(self, deadline_s=60.0):
        """Waits until gatewayd counts no request in flight; returns the loads it last saw."""
        deadline = time.monotonic() + deadline_s
        while True:
            loads = {n: w["active"] for n, w in self.workers().items()}
            if all(v == 0 for v in loads.values()) or time.monotonic() > deadline:
                return loads
            time.sleep(0.05)


def chat_args(model, content, max_tokens, **extra):
    args = dict(
        model=model,
        messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens,
        temperature=0,
    )
    args.update(extra)
    return args


def stream_text(stream, started=None):
    """Concatenated delta content of an openai chat stream, and the seconds from `started` (default:
    now) to its first token."""
    started = time.monotonic() if started is None else started
    first = None
    parts = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.monotonic() - started
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts), first


class LoadSampler:
    """Polls /admin/workers in the background and keeps each worker's peak `active`."""

    def __init__(self, fleet):
        self.fleet = fleet
        self.peak = collections.Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            try:
                for name, worker in self.fleet.workers().items():
                    self.peak[name] = max(self.peak[name], worker["active"])
            except Exception:  # noqa: BLE001 - sampling is best effort
                pass
            time.sleep(0.02)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


# ---------------------------------------------------------------- checks

results: list[tuple[str, bool, str]] = []
notes: list[str] = []


def check(name):
    def decorate(fn):
        def run(*args):
            print(f"--- {name}", flush=True)
            started = time.monotonic()
            try:
                detail = fn(*args) or ""
                ok = True
            except Exception as error:  # noqa: BLE001 - every failure is reported, then the rest run
                traceback.print_exc()
                detail = f"{type(error).__name__}: {error}"
                ok = False
            took = time.monotonic() - started
            print(f"{'PASS' if ok else 'FAIL'} {name} ({took:.1f} s) {detail}", flush=True)
            results.append((name, ok, detail))
            return ok

        return run

    return decorate


@check("doc_examples")
def doc_examples(fleet, doc_path):
    """docs/real-workers.md's curl and openai examples are these files, and work against gatewayd."""
    doc = open(doc_path, encoding="utf-8").read()
    addr = fleet.gateway.removeprefix("http://")
    out = {}
    for file, runner in (("curl.sh", ["bash", "-c"]), ("client.py", [sys.executable, "-c"])):
        text = open(os.path.join(HERE, "examples", file), encoding="utf-8").read()
        assert text in doc, f"{doc_path} does not contain tests/real/examples/{file} verbatim"
        assert EXAMPLE_ADDR in text
        proc = subprocess.run(
            runner + [text.replace(EXAMPLE_ADDR, addr)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        print(proc.stdout, end="")
        print(proc.stderr, end="", file=sys.stderr)
        assert proc.returncode == 0, f"{file} exited {proc.returncode}"
        out[file] = proc.stdout
    curl = out["curl.sh"]
    statuses = re.findall(r"^HTTP/1\.1 (\d+)", curl, re.M)
    assert statuses == ["200", "200"], statuses
    curl_branches = re.findall(r"^x-bch-branch: (\S+)", curl, re.M | re.I)
    assert curl_branches == [HIT, HIT], curl_branches
    assert "text/event-stream" in curl and "data: [DONE]" in curl, "no event stream from curl -N"
    lines = out["client.py"].splitlines()
    worker, branch = lines[0].split()
    assert worker in fleet.names and branch == HIT, lines[0]
    assert lines[1].strip(), "empty non-streaming content"
    assert lines[2].split() == [worker, HIT], lines[2]
    assert lines[3].strip(), "empty streamed content"
    return f"curl and openai examples from docs/real-workers.md: 200, served by {worker}"


@check("stream_matches_worker")
def stream_matches_worker(fleet):
    """Streamed output through gatewayd equals the worker's own output for the same request.

    llama.cpp's greedy output depends on the worker's cache state (a prompt evaluated in one batch
    and one whose prefix was cached give slightly different logits, and greedy decoding can diverge),
    so each comparison is between runs that start from the same state: both cold (this check runs
    first, on freshly started workers), then both warm on the same worker.
    """
    key = f"equal-{uuid.uuid4().hex[:8]}"
    preferred = fleet.explain(key)["preferred"]
    other = fleet.other(preferred)
    args = chat_args(fleet.model, "Write one sentence about the sea.", 48)
    headers = {"X-SMG-Routing-Key": key}

    def via_gateway():
        raw = fleet.gw.chat.completions.with_raw_response.create(
            stream=True, extra_headers=headers, **args
        )
        assert raw.http_response.status_code == 200
        assert raw.headers["x-bch-worker"] == preferred, raw.headers["x-bch-worker"]
        return stream_text(raw.parse())[0]

    def direct(worker):
        return stream_text(fleet.direct[worker].chat.completions.create(stream=True, **args))[0]

    cold_direct = direct(other)  # the prompt is new to `other` ...
    cold_via = via_gateway()  # ... and to `preferred`
    assert cold_direct, "the worker streamed no content"
    assert cold_via == cold_direct, f"cold: through gatewayd {cold_via!r} != direct {cold_direct!r}"
    warm_direct = direct(preferred)  # the prompt is cached on `preferred` now ...
    warm_via = via_gateway()  # ... and in the same state for this one
    assert warm_via == warm_direct, f"warm: through gatewayd {warm_via!r} != direct {warm_direct!r}"
    note = "" if warm_via == cold_via else " (warm output differs from cold, as llama.cpp's does)"
    return (
        f"cold: {len(cold_via)} chars identical (gatewayd->{preferred} vs direct {other}); "
        f"warm: {len(warm_via)} chars identical (gatewayd->{preferred} vs direct {preferred}){note}"
    )


@check("chat_non_streaming")
def chat_non_streaming(fleet):
    key = f"chat-{uuid.uuid4().hex[:8]}"
    preferred = fleet.explain(key)["preferred"]
    raw = fleet.gw.chat.completions.with_raw_response.create(
        extra_headers={"X-SMG-Routing-Key": key},
        **chat_args(fleet.model, "What is the capital of France?", 24),
    )
    assert raw.http_response.status_code == 200
    assert (raw.headers["x-bch-worker"], raw.headers["x-bch-branch"]) == (preferred, HIT)
    completion = raw.parse()
    content = completion.choices[0].message.content
    assert content and content.strip(), f"empty content: {completion}"
    return f"200 from {preferred}: {content.strip()[:60]!r}"


@check("chat_streaming")
def chat_streaming(fleet):
    key = f"chat-{uuid.uuid4().hex[:8]}"
    preferred = fleet.explain(key)["preferred"]
    raw = fleet.gw.chat.completions.with_raw_response.create(
        stream=True,
        extra_headers={"X-SMG-Routing-Key": key},
        **chat_args(fleet.model, "What is the capital of Italy?", 24),
    )
    assert raw.http_response.status_code == 200
    assert raw.headers["content-type"].startswith("text/event-stream"), raw.headers["content-type"]
    assert (raw.headers["x-bch-worker"], raw.headers["x-bch-branch"]) == (preferred, HIT)
    text, _ = stream_text(raw.parse())
    assert text.strip(), "empty streamed content"
    return f"200 text/event-stream from {preferred}: {text.strip()[:60]!r}"


@check("other_branches")
def other_branches(fleet):
    """A keyless request and a target-worker miss, so /metrics has more branches to count."""
    status, headers, _ = http("GET", f"{fleet.gateway}/v1/models", gateway=True)
    assert status == 200 and headers["x-bch-branch"] == "keyless", (status, dict(headers))
    try:
        fleet.gw.models.list(extra_headers={"X-SMG-Target-Worker": "no-such-worker"})
        raise AssertionError("a target-worker miss was answered")
    except openai.APIStatusError as error:
        assert error.status_code == 503, error.status_code
        assert error.response.headers["x-bch-branch"] == "target_worker_miss"
        assert error.body["code"] == "target_worker_miss", error.body
    return "keyless 200, target_worker_miss 503"


@check("sticky_sequential")
def sticky_sequential(fleet):
    """Ten sequential requests with one key stay on one worker."""
    key = f"sticky-{uuid.uuid4().hex[:8]}"
    preferred = fleet.explain(key)["preferred"]
    placements = []
    for i in range(10):
        raw = fleet.gw.chat.completions.with_raw_response.create(
            extra_headers={"X-SMG-Routing-Key": key},
            **chat_args(fleet.model, f"Say the number {i}.", 8),
        )
        assert raw.http_response.status_code == 200
        raw.parse()
        placements.append((raw.headers["x-bch-worker"], raw.headers["x-bch-branch"]))
    assert set(placements) == {(preferred, HIT)}, placements
    return f"10/10 on {preferred}"


def long_document(fleet, target_tokens=1000):
    """A prompt of about `target_tokens` tokens that no worker has seen (a fresh nonce up front)."""
    nonce = uuid.uuid4().hex
    words = (
        "gateway worker cache prefix token routing ring session latency stream spill bound "
        "affinity prefill decode queue load mean skew gap healthy replica"
    ).split()
    lines, i = [f"Reference document {nonce}."], 0
    while True:
        lines.append(
            f"Note {i}: the {words[i % len(words)]} of {words[(i * 7) % len(words)]} "
            f"follows the {words[(i * 3) % len(words)]} in section {i * 13 % 97}."
        )
        i += 1
        if i % 10 == 0:
            text = "\n".join(lines)
            n = count_tokens(fleet, text)
            if n >= target_tokens:
                return text, n


def count_tokens(fleet, text):
    status, _, raw = http("POST", f"{fleet.worker_urls[0]}/extras/tokenize", {"input": text})
    if status == 200:
        return len(json.loads(raw)["tokens"])
    return len(text) // 4  # fallback estimate


@check("ttft_affinity")
def ttft_affinity(fleet):
    """Time to first token through gatewayd: a long prefix just processed on the same worker vs cold."""
    doc, n_tokens = long_document(fleet)
    key = f"ttft-{uuid.uuid4().hex[:8]}"
    preferred = fleet.explain(key)["preferred"]
    other = fleet.other(preferred)

    def ask(question, headers):
        started = time.monotonic()
        raw = fleet.gw.chat.completions.with_raw_response.create(
            stream=True,
            extra_headers=headers,
            **chat_args(fleet.model, f"{doc}\n\nQuestion: {question}", 8),
        )
        assert raw.http_response.status_code == 200
        text, ttft = stream_text(raw.parse(), started)
        assert text, "no token streamed"
        return raw.headers["x-bch-worker"], raw.headers["x-bch-branch"], ttft

    fleet.wait_idle()
    session = {"X-SMG-Routing-Key": key}
    w_cold, b_cold, cold = ask("What does note 3 say?", session)
    w_warm, b_warm, warm = ask("What does note 5 say?", session)
    w_other, b_other, cold_other = ask("What does note 5 say?", {"X-SMG-Target-Worker": other})
    assert (w_cold, b_cold) == (preferred, HIT), (w_cold, b_cold)
    assert (w_warm, b_warm) == (preferred, HIT), (w_warm, b_warm)
    assert (w_other, b_other) == (other, "target_worker_hit"), (w_other, b_other)
    figures = (
        f"TTFT through gatewayd, {n_tokens}-token prefix: cold {cold:.2f} s on {preferred}, "
        f"warm {warm:.2f} s on {preferred} (same key), cold {cold_other:.2f} s on {other}"
    )
    notes.append(figures)
    return figures


def burst(fleet, n, client, headers):
    """n concurrent chat completions released together; returns [(worker, branch)] and peak loads."""
    barrier = threading.Barrier(n)

    def one(i):
        barrier.wait()
        raw = client.chat.completions.with_raw_response.create(
            extra_headers=headers,
            **chat_args(fleet.model, f"Count from 1 to 50. ({i})", 64, logit_bias=NO_EOS),
        )
        assert raw.http_response.status_code == 200, raw.http_response.status_code
        raw.parse()
        return raw.headers["x-bch-worker"], raw.headers["x-bch-branch"]

    fleet.wait_idle()
    with LoadSampler(fleet) as sampler:
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            placements = list(pool.map(one, range(n)))
    return placements, dict(sampler.peak)


@check("explicit_burst_spills")
def explicit_burst_spills(fleet):
    """Concurrent same-key requests spill off the preferred worker as the bounded rule says."""
    n = 8
    key = f"burst-{uuid.uuid4().hex[:8]}"
    explain = fleet.explain(key)
    preferred = explain["preferred"]
    other = fleet.other(preferred)
    gap, skew = explain["policy"]["min_load_gap"], explain["policy"]["max_load_skew"]
    before = fleet.workers()
    placements, peak = burst(fleet, n, fleet.gw, {"X-SMG-Routing-Key": key})
    after = fleet.workers()
    counts = collections.Counter(placements)
    spills = counts[(other, SPILL)]
    hits = counts[(preferred, HIT)]
    assert hits + spills == n, f"unexpected placements {dict(counts)}"
    # The first gap + 1 arrivals cannot spill (preferred - min <= gap); with every request in flight
    # at once the rule gives 6:2 on two workers at gap 2 / skew 1.5 (docs/policy.md); a worker that
    # finishes early lowers the minimum and can only add spills.
    assert spills >= 1, f"no request spilled: {dict(counts)}, peak loads {peak}"
    assert hits >= gap + 1, f"fewer than {gap + 1} stayed on {preferred}: {dict(counts)}"
    spilled_out = after[preferred]["spilled_out_total"] - before[preferred]["spilled_out_total"]
    spilled_in = after[other]["spilled_in_total"] - before[other]["spilled_in_total"]
    assert spilled_out == spills == spilled_in, (spilled_out, spills, spilled_in)
    detail = (
        f"{n} concurrent requests with one X-SMG-Routing-Key, gap {gap} skew {skew}: "
        f"{hits} on {preferred} (preferred), {spills} spilled to {other}; "
        f"peak in-flight {peak.get(preferred, 0)}:{peak.get(other, 0)}"
    )
    notes.append(f"explicit burst: {hits}:{spills}")
    return detail


@check("implicit_burst_never_spills")
def implicit_burst_never_spills(fleet):
    """The same burst keyed by Authorization (an implicit key) all lands on one worker."""
    n = 8
    api_key = f"tenant-{uuid.uuid4().hex[:8]}"
    explain = fleet.explain(f"Bearer {api_key}", explicit=False)
    preferred = explain["preferred"]
    gap = explain["policy"]["min_load_gap"]
    client = fleet.client_with_key(api_key)
    placements, peak = burst(fleet, n, client, {})
    assert set(placements) == {(preferred, IMPLICIT)}, placements
    # An explicit key would have spilled once the preferred worker held gap + 2 requests.
    assert peak.get(preferred, 0) >= gap + 2, (
        f"the burst never loaded {preferred} past the spill bound (peak {peak}); "
        "the check proves nothing"
    )
    return f"{n}/{n} on {preferred} ({IMPLICIT}), peak in-flight {peak.get(preferred, 0)}"


@check("disconnect_releases_load")
def disconnect_releases_load(fleet):
    """A client that disconnects mid-stream leaves every active counter at 0."""
    key = f"disconnect-{uuid.uuid4().hex[:8]}"
    fleet.wait_idle()
    stream = fleet.gw.chat.completions.create(
        stream=True,
        extra_headers={"X-SMG-Routing-Key": key},
        **chat_args(fleet.model, "Tell me a very long story.", 1500, logit_bias=NO_EOS),
    )
    worker = stream.response.headers["x-bch-worker"]
    chunks = iter(stream)
    for _ in range(3):
        next(chunks)
    active_mid = fleet.workers()[worker]["active"]
    stream.close()  # closes the connection with the body unread
    closed = time.monotonic()
    loads = fleet.wait_idle(30)
    released = time.monotonic() - closed
    assert active_mid == 1, f"{worker} active {active_mid} while streaming"
    assert all(v == 0 for v in loads.values()), f"active counters after disconnect: {loads}"
    # The worker itself notices the disconnect at its next chunk and takes the next request.
    started = time.monotonic()
    fleet.direct[worker].chat.completions.create(**chat_args(fleet.model, "Hi", 1))
    free = time.monotonic() - started
    return (
        f"{worker} active 1 mid-stream, all 0 {released:.2f} s after the disconnect; "
        f"the worker answered a new request {free:.2f} s later"
    )


@check("metrics_count_branches")
def metrics_count_branches(fleet, baseline):
    """/metrics counts exactly the branches the client saw (since the baseline)."""
    metrics = fleet.metrics()
    got = {}
    for name, value in metrics.items():
        m = re.fullmatch(r'bch_branch_total\{branch="([a-z_]+)"\}', name)
        if m:
            delta = value - baseline.get(name, 0.0)
            if delta:
                got[m.group(1)] = int(delta)
    with seen_lock:
        want = dict(seen_branches)
    assert got == want, f"/metrics {got} != seen {want}"
    actives = {k: v for k, v in metrics.items() if k.startswith("bch_worker_active{")}
    assert actives and all(v == 0 for v in actives.values()), actives
    return ", ".join(f"{b}={n}" for b, n in sorted(got.items()))


@check("worker_metrics_without_gauges")
def worker_metrics_without_gauges(fleet):
    """llama-cpp-python's server exports no /metrics: with `load_source = worker_metrics` every
    scrape is a 404, so each worker falls back to local load, counted and marked stale, and routing
    goes on exactly as in `local` mode (docs/replicas.md)."""
    status, _, raw = http("PUT", f"{fleet.control}/admin/policy", body={"load_source": "worker_metrics"})
    assert status == 200 and json.loads(raw)["load_source"] == "worker_metrics", (status, raw)
    try:
        deadline = time.monotonic() + 30
        while True:
            metrics = fleet.metrics()
            failed = {
                name: metrics.get(
                    f'bch_load_scrape_failures_total{{worker="{name}",reason="http_status"}}', 0
                )
                for name in fleet.names
            }
            if all(v > 0 for v in failed.values()):
                break
            assert time.monotonic() < deadline, f"no 404 scrape failures counted: {failed}"
            time.sleep(0.1)
        workers = fleet.workers()
        assert all(w["load_stale"] for w in workers.values()), workers
        assert all(w.get("reported_load") is None for w in workers.values()), workers
        key = f"metrics-{uuid.uuid4().hex[:8]}"
        explain = fleet.explain(key)
        assert explain["load_signal"] == "local", explain
        raw = fleet.gw.chat.completions.with_raw_response.create(
            extra_headers={"X-SMG-Routing-Key": key},
            **chat_args(fleet.model, "Name a colour.", 8),
        )
        assert raw.http_response.status_code == 200
        assert (raw.headers["x-bch-worker"], raw.headers["x-bch-branch"]) == (explain["preferred"], HIT)
        return f"404 scrapes counted {failed}; routed on local load to {explain['preferred']}"
    finally:
        http("PUT", f"{fleet.control}/admin/policy", body={"load_source": "local"})


@check("llama_server_gauges_reach_the_rule")
def llama_server_gauges_reach_the_rule(fleet, model_path):
    """llama.cpp's own server exports `llamacpp:requests_processing` and `requests_deferred`. Added
    to the running gateway with `load_source = worker_metrics`, its requests that did not come
    through this gateway (sent to it directly, as another replica would) show up in the load the
    rule reads, and go back to 0 when they end (docs/replicas.md)."""
    port = free_port()
    log = open(os.path.join(HERE, ".work", "llama-server.log"), "wb")
    server = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "llama_server.py"), "--model", model_path, "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    name = "llama-server"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, f"llama_server.py exited with {server.returncode}"
            try:
                if http("GET", f"{url}/health", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "llama-server not healthy in 120 s"
            time.sleep(0.2)
        status, _, raw = http("POST", f"{fleet.control}/admin/workers", body={"name": name, "url": url})
        assert status == 201, (status, raw)
        status, _, raw = http("PUT", f"{fleet.control}/admin/policy", body={"load_source": "worker_metrics"})
        assert status == 200, (status, raw)

        def wait_record(what, cond, deadline_s=60):
            deadline = time.monotonic() + deadline_s
            while True:
                record = fleet.workers()[name]
                if cond(record):
                    return record
                assert time.monotonic() < deadline, f"{what}: {record}"
                time.sleep(0.05)

        wait_record("a first good scrape", lambda r: r.get("reported_load") == 0 and not r["load_stale"])
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)

        def generate():
            client.chat.completions.create(
                **chat_args(fleet.model, "Tell a long story.", 200, logit_bias=NO_EOS)
            )

        # Two requests on one slot: one processing, one deferred. Neither went through gatewayd.
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            running = [pool.submit(generate) for _ in range(2)]
            busy = wait_record(
                "both direct requests in the reported load", lambda r: r.get("reported_load", 0) >= 2
            )
            assert busy["active"] == 0, busy
            for future in running:
                future.result()
        idle = wait_record("the reported load back to 0", lambda r: r.get("reported_load") == 0)
        return f"reported {busy['reported_load']} with 0 local in flight, then {idle['reported_load']}"
    finally:
        http("PUT", f"{fleet.control}/admin/policy", body={"load_source": "local"})
        http("DELETE", f"{fleet.control}/admin/workers/{name}")
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@check("two_models")
def two_models(fleet, gateway, control):
    """A second gatewayd over the same two workers, each declared with the model it serves (the same
    GGUF under two names): every request lands in its model's pool, through the openai client, even
    the keys the one-pool ring puts on the other worker; `/v1/models` is the gateway's union; an
    unknown model is a 404 `model_not_found` that reaches no worker (docs/models.md)."""
    gateway, control = gateway.rstrip("/"), control.rstrip("/")
    records = {w["name"]: w for w in get_json(f"{control}/admin/workers")["workers"]}
    assert sorted(records) == sorted(fleet.names), (sorted(records), fleet.names)
    worker_of = {}
    for name, record in records.items():
        (model,) = record["models"]
        worker_of[model] = name
        # The worker's own list: its alias, and what the gateway learns from it.
        listed = [m.id for m in fleet.direct[name].models.list().data]
        assert listed == [model], f"{name} serves {listed}, declared {model!r}"
    assert len(worker_of) == 2, records
    deadline = time.monotonic() + 30
    while any(w.get("reported_models") != w["models"] for w in records.values()):
        assert time.monotonic() < deadline, f"reported_models not learned: {records}"
        time.sleep(0.2)
        records = {w["name"]: w for w in get_json(f"{control}/admin/workers")["workers"]}
    before = {name: w["requests_total"] for name, w in records.items()}
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="two-models", max_retries=0, timeout=300)

    listed = [m.id for m in client.models.list().data]
    assert listed == sorted(worker_of), f"gateway /v1/models {listed}, pools {sorted(worker_of)}"

    # openai-python writes `messages` before `model`: a long message puts the model late (about
    # 1.5 KiB here, a few hundred tokens: each worker's first prefill of it costs seconds).
    filler = "Background: " + " ".join(f"fact {i} is about routing." for i in range(60))
    sent = collections.Counter()
    placements = []
    for model, name in sorted(worker_of.items()):
        url = records[name]["url"]
        # Keys the one-pool gateway puts on the other worker, and no key at all (the client's
        # Authorization is then the implicit key): all stay in the model's pool.
        keys = []
        while len(keys) < 3:
            key = f"model-{uuid.uuid4().hex[:8]}"
            if fleet.explain(key)["preferred"] != name:
                keys.append(key)
        for key in keys + [None]:
            headers = {"X-SMG-Routing-Key": key} if key else {}
            if key:
                query = urllib.parse.urlencode({"routing_key": key, "model": model})
                decided = get_json(f"{control}/admin/explain?{query}")
                assert decided["preferred"] == name, (model, key, decided)
            for stream in (False, True):
                raw = client.chat.completions.with_raw_response.create(
                    stream=stream,
                    extra_headers=headers,
                    **chat_args(model, f"{filler}\n\nQuestion: what is fact 3 about?", 8),
                )
                assert raw.http_response.status_code == 200, raw.http_response.status_code
                served = (raw.headers["x-bch-worker"], raw.headers["x-smg-routed-worker-id"])
                assert served == (name, url), f"{model} (key {key}) served by {served}, not {name}"
                if stream:
                    assert raw.headers["content-type"].startswith("text/event-stream")
                    text, _ = stream_text(raw.parse())
                else:
                    text = raw.parse().choices[0].message.content
                assert text and text.strip(), f"{model}: empty {'stream' if stream else 'answer'}"
                sent[name] += 1
                placements.append((model, raw.headers["x-bch-branch"]))

    try:
        client.chat.completions.create(**chat_args("no-such-model", "Hi", 1))
        raise AssertionError("a request for an unknown model was answered")
    except openai.NotFoundError as error:
        assert error.body["code"] == "model_not_found", error.body
        assert error.response.headers["x-smg-error-code"] == "model_not_found"
    after = {w["name"]: w["requests_total"] for w in get_json(f"{control}/admin/workers")["workers"]}
    served = {name: after[name] - before[name] for name in after}
    assert served == dict(sent), f"requests_total grew by {served}, sent {dict(sent)}"
    branches = collections.Counter(branch for _, branch in placements)
    return (
        f"{sum(sent.values())} requests (half streamed) each on its model's worker "
        f"{dict(sorted(worker_of.items()))} ({dict(branches)}); /v1/models {listed}; "
        "unknown model 404 model_not_found, no worker reached"
    )


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--control", required=True)
    parser.add_argument("--worker", action="append", required=True)
    parser.add_argument("--doc", required=True, help="docs/real-workers.md: its examples are run.")
    parser.add_argument("--summary", required=True)
    parser.add_argument("--model", required=True, help="The GGUF file the workers serve.")
    parser.add_argument(
        "--models-gateway", required=True, help="The gatewayd whose workers each declare a model."
    )
    parser.add_argument("--models-control", required=True, help="Its control plane.")
    args = parser.parse_args()
    started = time.monotonic()

    fleet = Fleet(args)
    deadline = time.monotonic() + 60
    while not all(w["healthy"] for w in fleet.workers().values()):
        assert time.monotonic() < deadline, f"workers not healthy: {fleet.workers()}"
        time.sleep(0.5)
    fleet.model = fleet.direct[fleet.names[0]].models.list().data[0].id
    print(f"workers {fleet.url_of}; model id {fleet.model!r}", flush=True)

    stream_matches_worker(fleet)  # first: both workers are still cold
    doc_examples(fleet, args.doc)
    baseline = fleet.metrics()
    with seen_lock:
        seen_branches.clear()
    chat_non_streaming(fleet)
    chat_streaming(fleet)
    other_branches(fleet)
    sticky_sequential(fleet)
    ttft_affinity(fleet)
    explicit_burst_spills(fleet)
    implicit_burst_never_spills(fleet)
    disconnect_releases_load(fleet)
    metrics_count_branches(fleet, baseline)
    worker_metrics_without_gauges(fleet)  # it switches the load source back and forth
    llama_server_gauges_reach_the_rule(fleet, args.model)  # adds and removes a third worker
    two_models(fleet, args.models_gateway, args.models_control)  # the other gatewayd

    passed = sum(1 for _, ok, _ in results if ok)
    failed = len(results) - passed
    took = time.monotonic() - started
    print(f"\nchecks took {took:.0f} s", flush=True)
    for note in notes:
        print(note, flush=True)
    with open(args.summary, "w", encoding="utf-8") as out:
        for note in notes:
            if note.startswith("TTFT"):
                out.write(note + "\n")
        out.write(f"real: {passed} passed, {failed} failed\n")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
