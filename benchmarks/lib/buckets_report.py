"""benchmarks/transformer_buckets.py's tables: each contender at each sequence length and weighted,
with the speedup over the defaults (side_by_side_report's statistics), then the replay: each bucket
served as eager and through `apply`, against what the search measured."""

from __future__ import annotations

from typing import Any

from autotune.measure import stats

from lib import common, side_by_side_report

TOLERANCE = 0.10  # the Done-when: served "within 10% on each bucket" of what was measured


def markdown(found: dict[str, Any], part: dict[str, Any]) -> str:
    return "\n".join([*contenders(found, part), "", *replay(found, part), ""]) + "\n"


def contenders(found: dict[str, Any], part: dict[str, Any]) -> list[str]:
    lower = part["objective"] == "latency"
    unit = "p50 ms" if lower else "items/s"
    lengths = [str(n) for n in found["lengths"]]
    weights = "/".join(f"{w:.2g}" for w in found["weights"])
    lines = [f"### {found['model']}, {part['objective']} (batch {part['batch_size']}), lengths {', '.join(lengths)}",
             "", common.provenance_line(found), "",
             "| contender | knobs | " + "".join(f"{n} tokens: {unit} | " for n in lengths)
             + f"weighted: {unit}, median (min-max) | speedup over defaults (Hodges-Lehmann, interval) | rounds ok "
             "| note |", "|---|---|" + "---|" * len(lengths) + "---|---|---|---|"]
    for contender, summary, runs in zip(part["contenders"], part["summary"]["rows"], part["runs"], strict=True):
        cells = [number(per_length(runs, n, part["batch_size"], lower)) for n in lengths]
        lines.append(side_by_side_report.table_row(contender, summary, cells))
    each = "p50 in the round" if lower else "items/s in the round (instances x batch / the length's p50)"
    figure = "p50 of the weighted mean of the calls" if lower else "items over the time of a stream with those shares"
    lines += ["", f"- each length: the median over the rounds of that length's {each}; weighted (weights {weights}): "
              f"`autotune bench`'s own figure, the one the search optimised ({figure}); speedups: of the weighted "
              "figure, paired by round",
              winner_per_length(part, lengths), side_by_side_report.verdict_line(part)]
    return lines


def bucket_series(runs: list[dict[str, Any]], length: str) -> list[float | None]:
    """A contender's p50 ms at one length, round by round (None where it failed)."""
    return [run["buckets"].get(length) if run["ok"] else None for run in runs]


def per_length(runs: list[dict[str, Any]], length: str, batch: int, lower: bool) -> float | None:
    """The median over the rounds of the p50 ms, or of the items/s of all the instances together."""
    ran = [(p50, run["instances"]) for p50, run in zip(bucket_series(runs, length), runs, strict=True) if p50]
    if not ran:
        return None
    return stats.median([p50 if lower else instances * batch * 1e3 / p50 for p50, instances in ran])


def winner_per_length(part: dict[str, Any], lengths: list[str]) -> str:
    """The winner (last) over the defaults (first) at each length, paired by round on its p50."""
    runs = part["runs"]
    paired = [side_by_side_report.paired(side_by_side_report.ratios(bucket_series(runs[0], n),
                                                                    bucket_series(runs[-1], n), True))
              for n in lengths]
    shown = [f"{n}: {side_by_side_report.speedup_text(found)}" for n, found in zip(lengths, paired, strict=True)]
    return "- the winner over the defaults at each length (its p50, paired by round): " + ", ".join(shown)


def replay(found: dict[str, Any], part: dict[str, Any]) -> list[str]:
    done, measured = part["replay"], part["measured"]
    eager, applied = done["eager"], done["apply"]
    trial = measured["trial"]
    winner = part["runs"][-1]
    lines = [f"#### Replay, {part['objective']}: {done['requests']} requests of {done['lengths']} tokens "
             f"(spread evenly, random order), "
             f"batch {part['batch_size']}", "",
             "| bucket | eager p50 ms (requests) | apply p50 ms (requests) | apply over eager (p50) | apply mean ms "
             f"| measured ms (trial {trial}, {measured.get('source') or 'its search trial'}) "
             f"| side by side: winner's ms | served mean / measured | within {TOLERANCE:.0%} |",
             "|---|---|---|---|---|---|---|---|---|"]
    for length in map(str, found["lengths"]):
        served, eager_p50, mean = of(applied, length), of(eager, length), of(applied, length, "mean_ms")
        wanted = measured["buckets"].get(length)
        beside = [v for v in bucket_series(winner, length) if v is not None]
        lines.append(f"| {length} | {cell(eager, length)} | {cell(applied, length)} "
                     f"| {ratio_text(eager_p50, served)} | {number(mean)} | {number(wanted)} "
                     f"| {number(stats.median(beside) if beside else None)} | {fraction(mean, wanted)} "
                     f"| {within(mean, wanted)} |")
    lines += ["", served_line("eager", eager), served_line("apply", applied),
              "- apply over eager: eager p50 / apply p50 (above 1: apply is faster); eager runs each request at its "
              "own length, apply pads it to its bucket (shapes=dynamic: runs it at its own length); measured: the "
              "exported trial's p50 for the bucket (the median over its confirmation's rounds where it ran in "
              "them), a model that takes any length timed at four lengths spread over it "
              "(their mean, the mean request's cost); served mean / measured: what the stream's requests in the "
              "bucket cost on average against it"]
    return lines


def of(server: dict[str, Any], length: str, figure: str = "p50_ms") -> float | None:
    found = server.get("buckets", {}).get(length)
    return found.get(figure) if found else None


def cell(server: dict[str, Any], length: str) -> str:
    if not server["ok"]:
        return "failed"
    found = server["buckets"].get(length)
    return f"{number(found['p50_ms'])} ({found['requests']})" if found else "no request"


def served_line(name: str, server: dict[str, Any]) -> str:
    if not server["ok"]:
        return f"- {name}: failed: {server['reason']}"
    return (f"- {name}: {server['configuration']}, ready in {server['ready_s']:.1f} s (load, first request), "
            f"{server['instances']} process(es)")


def ratio_text(reference: float | None, candidate: float | None) -> str:
    return f"{reference / candidate:.2f}x" if reference and candidate else "-"


def fraction(served: float | None, wanted: float | None) -> str:
    return f"{served / wanted:.2f}" if served and wanted else "-"


def within(served: float | None, wanted: float | None) -> str:
    if not served or not wanted:
        return "-"
    off = served / wanted - 1
    return "yes" if abs(off) <= TOLERANCE else f"no ({'slower' if off > 0 else 'faster'})"


def number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 10 else f"{value:.3f}"
