#!/usr/bin/env python3
"""Summarises bench/proxy.sh trials: medians per workload and target, one table, gatewayd/HAProxy ratios.

Input: one JSON object per trial (JSON lines). Output: the table on stdout and everything (settings,
per-trial rows, medians, ratios) as JSON in --out.
"""

import argparse
import datetime
import json
import statistics

WORKLOADS = {
    "a": "(a) keyed POST, 1 KiB JSON",
    "b": "(b) keyed SSE, 64 chunks",
    "c": "(c) held SSE streams",
}
TARGETS = ["direct", "gatewayd", "haproxy"]
METRICS = ["rps", "p50_ms", "p99_ms", "cpu_per_1k", "peak_rss_kib", "rss_per_stream_kib", "failed"]


def median(rows, key):
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def fmt(value, spec, suffix=""):
    return "—" if value is None else format(value, spec) + suffix


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", required=True)
    ap.add_argument("--shape")
    ap.add_argument("--out", required=True)
    ap.add_argument("--meta", nargs="*", default=[])
    args = ap.parse_args()
    trials = [json.loads(line) for line in open(args.trials) if line.strip()]
    meta = dict(item.split("=", 1) for item in args.meta)
    shape = json.load(open(args.shape)) if args.shape else {}

    summary = {}
    for w in WORKLOADS:
        for t in TARGETS:
            rows = [r for r in trials if r["workload"] == w and r["target"] == t]
            if rows:
                summary.setdefault(w, {})[t] = {m: median(rows, m) for m in METRICS} | {"trials": len(rows)}

    ratios = {}
    for w, targets in summary.items():
        g, h = targets.get("gatewayd"), targets.get("haproxy")
        if g and h:
            ratios[w] = {
                m: (g[m] / h[m] if g[m] is not None and h[m] else None)
                for m in ["rps", "p50_ms", "p99_ms", "cpu_per_1k", "peak_rss_kib", "rss_per_stream_kib"]
            }

    header = ("| workload | target | req/s | p50 ms | p99 ms | CPU s / 1k req | peak RSS MiB "
              "| RSS KiB / held stream | failed |")
    lines = [header, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for w, targets in summary.items():
        for t in TARGETS:
            s = targets.get(t)
            if not s:
                continue
            rss = s["peak_rss_kib"] / 1024 if s["peak_rss_kib"] is not None else None
            lines.append(
                f"| {WORKLOADS[w]} | {t} | {fmt(s['rps'], ',.0f')} | {fmt(s['p50_ms'], '.2f')} "
                f"| {fmt(s['p99_ms'], '.2f')} | {fmt(s['cpu_per_1k'], '.3f')} | {fmt(rss, '.1f')} "
                f"| {fmt(s['rss_per_stream_kib'], '.1f')} | {fmt(s['failed'], '.0f')} |"
            )
        r = ratios.get(w)
        if r:
            lines.append(
                f"| {WORKLOADS[w]} | **gatewayd / HAProxy** | {fmt(r['rps'], '.2f', '×')} "
                f"| {fmt(r['p50_ms'], '.2f', '×')} | {fmt(r['p99_ms'], '.2f', '×')} "
                f"| {fmt(r['cpu_per_1k'], '.2f', '×')} | {fmt(r['peak_rss_kib'], '.2f', '×')} "
                f"| {fmt(r['rss_per_stream_kib'], '.2f', '×')} | |"
            )
    table = "\n".join(lines)
    print(table)
    notes = []
    if "c" in summary:
        notes.append("(c): req/s = streams opened per second while ramping; p50/p99 = time to the first "
                     "SSE chunk; CPU = seconds per 1,000 streams opened and held for the hold period.")
    for note in notes:
        print(note)

    result = {
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": meta,
        "shape": shape,
        "summary": summary,
        "ratios_gatewayd_over_haproxy": ratios,
        "trials": trials,
        "table_markdown": table,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
