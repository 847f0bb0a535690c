#!/usr/bin/env python3
"""Summarises bench/proxy.sh trials: medians per workload and target, one table, gatewayd/peer ratios.

Input: one JSON object per trial (JSON lines); a trial whose target could not do the workload has
"na" (the reason) instead of numbers. Output: the table on stdout and everything (settings, per-trial
rows, medians, ratios of gatewayd to each peer) as JSON in --out.
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
TARGETS = ["direct", "gatewayd", "haproxy", "envoy", "smg", "envoy-bch"]
PEERS = {"haproxy": "HAProxy", "envoy": "Envoy", "smg": "SMG"}
METRICS = ["rps", "p50_ms", "p99_ms", "cpu_per_1k", "peak_rss_kib", "rss_per_stream_kib", "failed",
           "picker_cpu_per_1k", "requests"]
RATIO_METRICS = ["rps", "p50_ms", "p99_ms", "cpu_per_1k", "peak_rss_kib", "rss_per_stream_kib"]


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

    # Medians over the trials that ran; a target none of whose trials could run keeps the reason.
    summary = {}
    for w in WORKLOADS:
        for t in TARGETS:
            rows = [r for r in trials if r["workload"] == w and r["target"] == t]
            if not rows:
                continue
            ran = [r for r in rows if "na" not in r]
            if ran:
                s = {m: median(ran, m) for m in METRICS} | {"trials": len(ran)}
                if len(ran) < len(rows):
                    s["na_trials"] = [r["na"] for r in rows if "na" in r]
            else:
                s = {"na": rows[0]["na"], "trials": 0}
            summary.setdefault(w, {})[t] = s

    # gatewayd / peer for every peer that ran the workload: < 1 is better for all but req/s.
    ratios = {}
    for w, targets in summary.items():
        g = targets.get("gatewayd")
        if not g or "na" in g:
            continue
        for peer in PEERS:
            p = targets.get(peer)
            if p and "na" not in p:
                ratios.setdefault(peer, {})[w] = {
                    m: (g[m] / p[m] if g[m] is not None and p[m] else None) for m in RATIO_METRICS
                }

    header = ("| workload | target | req/s | p50 ms | p99 ms | CPU s / 1k req | peak RSS MiB "
              "| RSS KiB / held stream | failed |")
    lines = [header, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for w, targets in summary.items():
        for t in TARGETS:
            s = targets.get(t)
            if not s:
                continue
            if "na" in s:
                lines.append(f"| {WORKLOADS[w]} | {t} | n/a: {s['na']} | | | | | | |")
                continue
            rss = s["peak_rss_kib"] / 1024 if s["peak_rss_kib"] is not None else None
            lines.append(
                f"| {WORKLOADS[w]} | {t} | {fmt(s['rps'], ',.0f')} | {fmt(s['p50_ms'], '.2f')} "
                f"| {fmt(s['p99_ms'], '.2f')} | {fmt(s['cpu_per_1k'], '.3f')} | {fmt(rss, '.1f')} "
                f"| {fmt(s['rss_per_stream_kib'], '.1f')} | {fmt(s['failed'], '.0f')} |"
            )
        for peer, name in PEERS.items():
            r = ratios.get(peer, {}).get(w)
            if r:
                lines.append(
                    f"| {WORKLOADS[w]} | **gatewayd / {name}** | {fmt(r['rps'], '.2f', '×')} "
                    f"| {fmt(r['p50_ms'], '.2f', '×')} | {fmt(r['p99_ms'], '.2f', '×')} "
                    f"| {fmt(r['cpu_per_1k'], '.2f', '×')} | {fmt(r['peak_rss_kib'], '.2f', '×')} "
                    f"| {fmt(r['rss_per_stream_kib'], '.2f', '×')} | |"
                )
        # envoy-bch (Envoy with gatewayd as its endpoint picker) against Envoy alone: what the
        # picker adds to a request, and the picker's own CPU (included in envoy-bch's CPU column).
        e, b = targets.get("envoy"), targets.get("envoy-bch")
        if e and b and "na" not in e and "na" not in b:
            def delta(m):
                return b[m] - e[m] if b[m] is not None and e[m] is not None else None
            lines.append(
                f"| {WORKLOADS[w]} | **envoy-bch − Envoy** | {fmt(delta('rps'), '+,.0f')} "
                f"| {fmt(delta('p50_ms'), '+.3f')} | {fmt(delta('p99_ms'), '+.3f')} "
                f"| picker {fmt(b['picker_cpu_per_1k'], '.3f')} | | | |"
            )
    table = "\n".join(lines)
    print(table)
    notes = []
    if "c" in summary:
        notes.append("(c): req/s = streams opened per second while ramping; p50/p99 = time to the first "
                     "SSE chunk; CPU = seconds per 1,000 streams opened and held for the hold period.")
        asked = meta.get("streams")
        opened = ", ".join(f"{t} {fmt(s.get('requests'), ',.0f')}" for t, s in summary["c"].items() if "na" not in s)
        notes.append(f"(c): streams opened (median over reps) of {asked} asked: {opened}; RSS per stream "
                     "divides by the count opened.")
    if any("envoy-bch" in ts for ts in summary.values()):
        notes.append("envoy-bch: Envoy running `gatewayd envoy-config`'s bootstrap with gatewayd as its "
                     "endpoint picker, both on the proxy CPU; CPU = Envoy's plus the picker's, and the "
                     "`envoy-bch − Envoy` row gives the picker's own.")
    partial = [(w, t, s["na_trials"]) for w, ts in summary.items() for t, s in ts.items() if "na_trials" in s]
    for w, t, reasons in partial:
        notes.append(f"({w}) {t}: {len(reasons)} trial(s) n/a ({reasons[0]}); medians over the others.")
    for note in notes:
        print(note)

    result = {
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": meta,
        "shape": shape,
        "summary": summary,
        "ratios_gatewayd_over": ratios,
        # The key earlier results used (HAProxy only), kept for readers of those files.
        "ratios_gatewayd_over_haproxy": ratios.get("haproxy", {}),
        "trials": trials,
        "table_markdown": table,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
