#!/usr/bin/env python3
"""The helpers of bench/overload.sh, one subcommand each.

  sample --out FILE URL...     polls every worker's /metrics (vLLM gauge names) until SIGTERM and
                               writes one JSON line per sample: {t, worker, running, waiting, kv}
  leg --storm F --records F --samples F --target T --rep N --duration S --cap N
                               one leg's row (JSON on stdout) from bch-drill storm's --out and
                               --records and the sampler's file
  report --trials F [--ab F] --out F [--meta k=v ...]
                               the table on stdout and everything as JSON in --out
"""

import argparse
import json
import signal
import statistics
import sys
import time
import urllib.request

LABELS = {
    "gatewayd": "gatewayd, no admission",
    "admission": "gatewayd, admission",
    "haproxy": "HAProxy maxconn + queue",
}


def gauges(text):
    """running, waiting and KV usage from a vLLM-style exposition (the simulator's)."""
    out = {"running": None, "waiting": None, "kv": None}
    names = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
             "vllm:kv_cache_usage_perc": "kv"}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            out[names[name]] = float(line.rsplit(" ", 1)[1])
    return out


def sample(args):
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with open(args.out, "w") as out:
        while not stop:
            started = time.time()
            for i, url in enumerate(args.urls):
                try:
                    text = urllib.request.urlopen(f"{url}/metrics", timeout=1).read().decode()
                except Exception:  # noqa: BLE001 - a missed sample is only a gap
                    continue
                out.write(json.dumps({"t": time.time(), "worker": i, **gauges(text)}) + "\n")
            out.flush()
            time.sleep(max(0.0, args.interval - (time.time() - started)))


def p99(values):
    """Nearest-rank p99, as bch-drill reports it; None without values."""
    if not values:
        return None
    values = sorted(values)
    return values[max(0, -(-99 * len(values) // 100) - 1)]


def leg(args):
    storm = json.load(open(args.storm))
    records = [json.loads(line) for line in open(args.records) if line.strip()]
    samples = [json.loads(line) for line in open(args.samples) if line.strip()]
    overload = storm.get("overload") or {}
    # The overload shows as the trend inside the sending window: workers' waiting gauges and TTFT
    # of the first quarter of sends against the last.
    t0 = samples[0]["t"] if samples else 0.0
    quarter = args.duration / 4

    def waiting_in(lo, hi):
        values = [s["waiting"] for s in samples if s["waiting"] is not None and lo <= s["t"] - t0 < hi]
        return statistics.mean(values) if values else None

    def ttft_p99_in(lo, hi):
        return p99([r["ttft_ms"] for r in records
                    if r.get("ttft_ms") is not None and lo <= (r.get("sent_ms") or 0) / 1000 < hi])

    per_worker = {}
    for s in samples:
        if s["running"] is None or s["waiting"] is None:
            continue
        w = per_worker.setdefault(s["worker"], {"max_waiting": 0, "max_held": 0})
        w["max_waiting"] = max(w["max_waiting"], s["waiting"])
        w["max_held"] = max(w["max_held"], s["running"] + s["waiting"])
    row = {
        "target": args.target, "rep": args.rep,
        "rate_asked": (storm.get("open_loop") or {}).get("rate_asked"),
        "rate_achieved": (storm.get("open_loop") or {}).get("rate_achieved"),
        "peak_in_flight": (storm.get("open_loop") or {}).get("peak_in_flight"),
        "requests": storm.get("requests"),
        "ok_200": overload.get("answered"), "shed_503_retry_after": overload.get("shed"),
        "shed_503_without_retry_after": overload.get("shed_without_retry_after"),
        "other": overload.get("other"), "shed_by_branch": overload.get("shed_by_branch"),
        "goodput_rps": overload.get("goodput_rps"), "within_slo": overload.get("within_slo"),
        "ttft_p99_ms": storm["ttft"].get("p99_ms"), "ttft_p50_ms": storm["ttft"].get("p50_ms"),
        "ttft_p99_first_quarter_ms": ttft_p99_in(0, quarter),
        "ttft_p99_last_quarter_ms": ttft_p99_in(3 * quarter, 4 * quarter + 1e-9),
        "queue_wait": overload.get("queue_wait"),
        "worker_max_waiting": max((w["max_waiting"] for w in per_worker.values()), default=None),
        "worker_max_running_plus_waiting": max((w["max_held"] for w in per_worker.values()), default=None),
        "workers_mean_waiting_first_quarter": waiting_in(0, quarter),
        "workers_mean_waiting_last_quarter": waiting_in(3 * quarter, 4 * quarter),
        "cap": args.cap, "samples": len(samples),
        "drained": (storm.get("drain") or {}).get("all_zero"),
    }
    print(json.dumps(row))


def fmt(value, spec, missing="—"):
    return missing if value is None else format(value, spec)


def report(args):
    meta = dict(kv.split("=", 1) for kv in args.meta)
    rows = [json.loads(line) for line in open(args.trials) if line.strip()]
    capacity, limit = float(meta["capacity_rps"]), float(meta["ttft_limit_ms"])
    summary = {}
    for target in [t for t in LABELS if any(r["target"] == t for r in rows)]:
        mine = [r for r in rows if r["target"] == target]

        def med(key, mine=mine):
            values = [r[key] for r in mine if r.get(key) is not None]
            return statistics.median(values) if values else None

        def total(key, mine=mine):
            return sum(r.get(key) or 0 for r in mine)

        s = {k: med(k) for k in ["goodput_rps", "ttft_p99_ms", "ttft_p99_first_quarter_ms",
                                 "ttft_p99_last_quarter_ms", "workers_mean_waiting_first_quarter",
                                 "workers_mean_waiting_last_quarter", "rate_achieved"]}
        s.update({k: total(k) for k in ["requests", "ok_200", "shed_503_retry_after",
                                         "shed_503_without_retry_after", "other"]})
        s["worker_max_waiting"] = max((r["worker_max_waiting"] or 0) for r in mine)
        s["worker_max_running_plus_waiting"] = max((r["worker_max_running_plus_waiting"] or 0) for r in mine)
        waits = [r["queue_wait"]["p99_ms"] for r in mine if (r.get("queue_wait") or {}).get("p99_ms") is not None]
        s["queue_wait_p99_ms"] = statistics.median(waits) if waits else None
        s["reps"] = len(mine)
        s["goodput_of_capacity"] = s["goodput_rps"] / capacity if s["goodput_rps"] is not None else None
        s["goals"] = {
            "goodput_at_least_90pct_of_capacity": (s["goodput_of_capacity"] or 0) >= 0.9,
            "admitted_ttft_p99_within_limit": s["ttft_p99_ms"] is not None and s["ttft_p99_ms"] <= limit,
            "only_200_or_503_with_retry_after": s["shed_503_without_retry_after"] + s["other"] == 0,
        }
        if target != "gatewayd":  # the legs with a cap: the workers' own gauges never passed it
            s["goals"]["workers_running_plus_waiting_within_cap"] = (
                s["worker_max_running_plus_waiting"] <= int(meta["cap"]))
        summary[target] = s

    print(f"capacity {capacity:.1f} req/s ({meta['capacity_from']}); storm {float(meta['rate']):.1f} req/s "
          f"({meta['arrival']}) for {meta['duration_s']} s; unloaded TTFT p99 {float(meta['unloaded_ttft_p99_ms']):.0f} ms; "
          f"queue timeout {meta['queue_timeout_ms']} ms; TTFT SLO = limit = 2 x unloaded p99 + queue timeout "
          f"= {limit:.0f} ms; cap {meta['cap']} per worker (batch {meta['batch']})")
    if "admission" in summary:
        print(f"admission leg: {meta.get('admission_via')}")
    head = (f"{'leg':<24} {'goodput/s':>9} {'of cap':>7} {'TTFT p99':>9} {'first/last quarter':>19} "
            f"{'200':>6} {'503+RA':>6} {'other':>6} {'wait max':>8} {'held max':>8} {'waiting 1st/last q':>18}")
    if summary:
        print(head)
    for target, s in summary.items():
        quarters = f"{fmt(s['ttft_p99_first_quarter_ms'], '.0f')}/{fmt(s['ttft_p99_last_quarter_ms'], '.0f')} ms"
        waiting = (f"{fmt(s['workers_mean_waiting_first_quarter'], '.1f')}/"
                   f"{fmt(s['workers_mean_waiting_last_quarter'], '.1f')}")
        other = s["shed_503_without_retry_after"] + s["other"]
        print(f"{LABELS[target]:<24} {fmt(s['goodput_rps'], '9.1f')} {fmt(s['goodput_of_capacity'], '7.0%')} "
              f"{fmt(s['ttft_p99_ms'], '7.0f')}ms {quarters:>19} {s['ok_200']:>6} {s['shed_503_retry_after']:>6} "
              f"{other:>6} {s['worker_max_waiting']:>8.0f} {s['worker_max_running_plus_waiting']:>8.0f} {waiting:>18}")
    if "gatewayd" in summary:
        # The run is only a test of overload if the leg without admission was overloaded: the
        # workers' queues and TTFT grow over the sending window.
        s = summary["gatewayd"]
        w0, w1 = s["workers_mean_waiting_first_quarter"], s["workers_mean_waiting_last_quarter"]
        t0, t1 = s["ttft_p99_first_quarter_ms"], s["ttft_p99_last_quarter_ms"]
        shown = None not in (w0, w1, t0, t1) and w1 > w0 and t1 > t0
        s["overload_shown"] = shown
        print(f"  {LABELS['gatewayd']}: overload {'shown' if shown else 'NOT SHOWN (raise --factor)'}: workers' "
              f"mean waiting {fmt(w0, '.1f')} -> {fmt(w1, '.1f')}, TTFT p99 {fmt(t0, '.0f')} -> {fmt(t1, '.0f')} ms "
              f"(first -> last quarter)")
    for target, s in summary.items():
        if s["queue_wait_p99_ms"] is not None:
            print(f"  {LABELS[target]}: queue wait p99 {s['queue_wait_p99_ms']:.0f} ms (x-bch-queue-wait-ms)")
    for target, s in summary.items():
        failed = [goal for goal, ok in s["goals"].items() if not ok]
        print(f"  {LABELS[target]}: " + ("every goal met" if not failed else "NOT MET: " + ", ".join(failed)))

    result = {"meta": meta, "summary": summary, "legs": rows}
    if args.ab:
        ab = json.load(open(args.ab))
        cells = []
        print(f"A/B under overload, admission on ({ab.get('reps')} rep(s) per cell):")
        print(f"{'cell':<48} {'spill':>6} {'TTFT mean':>10} {'TTFT p99':>9} {'cached':>7} {'goodput/s':>9} {'shed':>6} {'unclean':>7}")
        for c in ab["cells"]:
            cell = {k: c.get(k) for k in ["label", "spill_fraction", "ttft_mean_ms", "ttft_p99_ms",
                                         "cached_token_fraction", "goodput_rps", "shed", "unclean",
                                         "hottest_worker_share", "throughput_rps", "significance"]}
            cells.append(cell)
            # Every cell carries the same admission settings: the policy names the cell.
            name = str(cell["label"]).split(":", 1)[0] + (" + admission" if ":" in str(cell["label"]) else "")
            print(f"{name:<48} {fmt(cell['spill_fraction'], '6.1%')} {fmt(cell['ttft_mean_ms'], '8.0f')}ms "
                  f"{fmt(cell['ttft_p99_ms'], '7.0f')}ms {fmt(cell['cached_token_fraction'], '7.1%')} "
                  f"{fmt(cell['goodput_rps'], '9.1f')} {fmt(cell['shed'], '6d')} {fmt(cell['unclean'], '7d')}")
        verdict = ab.get("verdict") or []
        for line in [verdict] if isinstance(verdict, str) else verdict:
            print(f"  {line}")
        result["ab"] = {"cells": cells, "verdict": ab.get("verdict"), "report": ab}
    json.dump(result, open(args.out, "w"), indent=2)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--out", required=True)
    s.add_argument("--interval", type=float, default=0.2)
    s.add_argument("urls", nargs="+")
    s = sub.add_parser("leg")
    for name in ["storm", "records", "samples", "target"]:
        s.add_argument(f"--{name}", required=True)
    s.add_argument("--rep", type=int, required=True)
    s.add_argument("--duration", type=float, required=True)
    s.add_argument("--cap", type=int, required=True)
    s = sub.add_parser("report")
    s.add_argument("--trials", required=True)
    s.add_argument("--ab")
    s.add_argument("--out", required=True)
    s.add_argument("--meta", nargs="*", default=[])
    args = ap.parse_args()
    {"sample": sample, "leg": leg, "report": report}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
