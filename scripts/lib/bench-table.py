#!/usr/bin/env python3
"""Turns load-bench's JSON lines into the figures table of docs/benchmarks.md.

Usage: scripts/lib/bench-table.py AFTER.jsonl [BEFORE.jsonl]  (markdown on stdout)
"""
import json
import sys


def load(path):
    by = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                d = json.loads(line)
                by.setdefault(d["scenario"], []).append(d)
    return by


def figures(by):
    out = {}
    tps = {d["clients"]: d["tps"] for d in by.get("pgbench", [])}
    for c, t in sorted(tps.items()):
        out[f"pgbench -N tps, {c} clients"] = f"{t:.0f}"
    for d in by.get("lifecycle", []):
        c = d["clients"]
        lat = d["latency_ms"].get("chunk", {})
        out[f"chunk reports/s, {c} clients (share of pgbench)"] = (
            f"{d['chunk_reports_per_s']:.0f} ({100 * (d['chunk_reports_to_pgbench'] or 0):.0f} %)")
        out[f"requests/s, runs/s, {c} clients"] = f"{d['requests_per_s']:.0f}, {d['runs_per_s']}"
        out[f"chunk report p50/p95/p99 ms, {c} clients"] = f"{lat.get('p50')} / {lat.get('p95')} / {lat.get('p99')}"
        cpu = d["cpu_ms_per_request"]
        out[f"CPU ms per request api-server / PostgreSQL, {c} clients"] = f"{cpu['api_server']} / {cpu['postgres']}"
        dl = d["dispatch_latency_ms"]
        out[f"dispatch p50/p99 ms under load, {c} clients"] = f"{dl.get('p50')} / {dl.get('p99')}"
    for d in by.get("completion", []):
        r = d["partition_completing_report_ms"]
        out[f"completing report p50/p99 ms, {d['partitions']} partitions"] = f"{r.get('p50')} / {r.get('p99')}"
    for d in by.get("completion_ratio", []):
        out["completion p50 ratio, largest / smallest"] = f"{d['p50_ratio']}"
    for d in by.get("manifest", []):
        out[f"manifest of {d['partitions']} partitions, p50 ms"] = f"{d['manifest_ms'].get('p50')}"
    for d in by.get("dispatch_idle", []):
        dl = d["dispatch_latency_ms"]
        out["dispatch p50/p99 ms, idle"] = f"{dl.get('p50')} / {dl.get('p99')}"
    for d in by.get("cancel_and_fail_under_storm", []):
        out["cancel / partition fail during a chunk storm, ms"] = f"{d['cancel']['ms']:.0f} / {d['partition_fail']['ms']:.0f}"
    for d in by.get("rss", []):
        a, o = d.get("api_server") or {}, d.get("operator") or {}
        out[f"RSS MiB {d['when']}: api-server (peak) / operator (peak)"] = (
            f"{a.get('rss_kib', 0) / 1024:.1f} ({a.get('peak_kib', 0) / 1024:.1f}) / "
            f"{o.get('rss_kib', 0) / 1024:.1f} ({o.get('peak_kib', 0) / 1024:.1f})")
    for d in by.get("mirror", []):
        lag = d["lag_ms"]
        out[f"mirror: {d['runs']} runs ({d['active']} active), initial sync s"] = f"{d['initial_sync_s']}"
        out["mirror: lag p50/p99 ms"] = f"{lag.get('p50')} / {lag.get('p99')}"
        out["mirror: API requests per change"] = f"{d['api_requests_per_change']}"
        out["mirror: operator RSS MiB (peak)"] = (
            f"{(d.get('operator_rss_kib') or 0) / 1024:.0f} ({(d.get('operator_peak_kib') or 0) / 1024:.0f})")
        out["mirror: operator CPU ms per change"] = f"{d['operator_cpu_ms_per_change']}"
    for d in by.get("multixact", []):
        out[f"MultiXacts per 1,000 fenced dispatcher outcomes ({d['outcomes']} outcomes)"] = f"{d['per_1000_outcomes']}"
    return out


def main():
    after = figures(load(sys.argv[1]))
    before = figures(load(sys.argv[2])) if len(sys.argv) > 2 else None
    if before is None:
        print("| measure | value |\n|---|---|")
        for k, v in after.items():
            print(f"| {k} | {v} |")
        return
    print("| measure | before | after |\n|---|---|---|")
    for k in list(dict.fromkeys(list(before) + list(after))):
        print(f"| {k} | {before.get(k, '–')} | {after.get(k, '–')} |")


if __name__ == "__main__":
    main()
