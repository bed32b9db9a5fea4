"""The peers bench's result file: the systems' medians side by side, each row against the
hand-written pattern, and the ratios issue 38's goals name, each with its goal.

Every ratio is of medians over the rounds. "× less CPU" is the other system's CPU per
message ÷ this one's; CPU per message is the system's whole CPU from its start (start-up
included) until its N messages are done, ÷ N.
"""

import statistics

# Issue 38's goals, per Carteiro row: (throughput × the pattern, × less CPU than the pattern).
VS_PATTERN = {
    "carteiro-relay-off-sqlite": (30, 25),
    "carteiro-sqlite": (None, 15),
    "carteiro-postgres": (10, 10),
    "carteiro-py-sqlite": (5, 5),
    "carteiro-py-batch-sqlite": (10, 10),
    "carteiro-js-batch-sqlite": (10, 10),
}
VS_CELERY_CPU = {"carteiro-sqlite": 8}  # × less CPU than Celery on the same backend
VS_LAPIN = {"carteiro-sqlite": 0.85, "carteiro-postgres": 0.5}  # throughput ÷ the limit
RELAY_ON_OFF_CPU = 1.5  # Rust route, relay on ÷ relay off, at most
PYTHON_RSS_MIB = 100  # a Python route's gateway, at most


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, digits=0):
    return "-" if v is None else f"{v:,.{digits}f}"


def div(a, b):
    return a / b if a is not None and b else None


def pattern_of(system):
    return f"pattern-{system.backend if system.backend != 'none' else 'sqlite'}"


def medians(chosen, results):
    keys = ("rate", "cpu", "broker", "pg", "p50", "p99", "rss")
    return {s.name: {k: median([r[k] for r in results[s.name]]) for k in keys}
            for s in chosen if results[s.name]}


def systems_table(chosen, med, mix):
    lines = [
        "| system | msg/s | CPU ms/msg (system, start-up included) | broker ms/msg "
        "| PostgreSQL ms/msg | p50 ms | p99 ms | peak RSS MiB | × the pattern's throughput "
        "| × less CPU than the pattern | failure mix |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in chosen:
        if s.name not in med:
            continue
        m, ref = med[s.name], med.get(pattern_of(s))
        x_rate = div(m["rate"], ref and ref["rate"])
        x_cpu = div(ref and ref["cpu"], m["cpu"])
        verdict = {True: "pass", False: "FAIL", None: "-"}[mix.get(s.name)]
        lines.append(
            f"| {s.name} | {fmt(m['rate'])} | {fmt(m['cpu'], 3)} | {fmt(m['broker'], 3)} | "
            f"{fmt(m['pg'], 3) if s.backend == 'postgres' else '-'} | {fmt(m['p50'])} | "
            f"{fmt(m['p99'])} | {fmt(m['rss'])} | {fmt(x_rate, 2)} | {fmt(x_cpu, 2)} | "
            f"{verdict} |")
    return lines


def goals_table(chosen, med):
    """One line per ratio the issue names, for the systems that ran."""
    rows = []

    def add(measure, value, goal=None, at_least=True, unit="×", digits=2):
        if value is None:
            return
        met = "-" if goal is None else ("yes" if (value >= goal if at_least else value <= goal)
                                        else "**no**")
        want = "reported" if goal is None else f"{'≥' if at_least else '≤'} {goal}{unit}"
        rows.append(f"| {measure} | {value:,.{digits}f}{unit} | {want} | {met} |")

    lapin = med.get("lapin-baseline")
    if lapin:
        rows.append(f"| the box's limit: lapin-baseline (consume, 3 confirmed publishes, ack) "
                    f"| {fmt(lapin['rate'])} msg/s, {fmt(lapin['cpu'], 3)} ms CPU/msg "
                    f"(broker {fmt(lapin['broker'], 3)}) | reported | - |")
    for s in chosen:
        if s.kind != "carteiro" or s.name not in med:
            continue
        m = med[s.name]
        pattern, celery = med.get(pattern_of(s)), med.get(f"celery-{s.backend}")
        rate_goal, cpu_goal = VS_PATTERN.get(s.name, (None, None))
        if pattern:
            add(f"{s.name}: throughput ÷ {pattern_of(s)}", div(m["rate"], pattern["rate"]),
                rate_goal)
            add(f"{s.name}: CPU per message, × less than {pattern_of(s)}",
                div(pattern["cpu"], m["cpu"]), cpu_goal)
        if celery:
            add(f"{s.name}: CPU per message, × less than celery-{s.backend}",
                div(celery["cpu"], m["cpu"]), VS_CELERY_CPU.get(s.name))
        if lapin:
            add(f"{s.name}: throughput ÷ lapin-baseline", div(m["rate"], lapin["rate"]),
                VS_LAPIN.get(s.name))
        if s.lang == "rust" and s.relay and f"carteiro-relay-off-{s.backend}" in med:
            off = med[f"carteiro-relay-off-{s.backend}"]
            add(f"{s.name}: gateway CPU per message, relay on ÷ relay off",
                div(m["cpu"], off["cpu"]), RELAY_ON_OFF_CPU, at_least=False)
        add(f"{s.name}: gateway peak RSS", m["rss"],
            PYTHON_RSS_MIB if s.lang == "py" else None, at_least=False, unit=" MiB", digits=0)
    if not rows:
        return []
    return ["| measure | figure | goal | met |", "|---|---:|---|---|"] + rows


def per_round(results):
    return ["Per round, msg/s and CPU ms/msg: " + "; ".join(
        f"{name} " + " / ".join(f"{fmt(r['rate'])} ({fmt(r['cpu'], 3)})" for r in rs)
        for name, rs in results.items() if rs)]
