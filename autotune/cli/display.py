"""Rendering results for people: rich tables on stdout, progress on stderr."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autotune.cli.streams import is_terminal
from autotune.host.topology import format_cpus
from autotune.measure import quality

# Every `--json` payload carries what it is and the version of its layout; a field removed or
# changed in meaning bumps the version, a field added does not.
JSON_SCHEMA_VERSION = 1


def json_document(kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """A `--json` payload: `kind` (the command) and `schema_version` first, then the body. A number
    that is not finite (an interval unbounded for too few rounds) is null: strict JSON has no inf."""
    return {"kind": kind, "schema_version": JSON_SCHEMA_VERSION, **_finite(dict(body))}


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# Piped output (CI logs, `| less`) gets wide tables instead of 80 columns of folded cells.
out = Console(highlight=False, width=None if is_terminal(sys.stdout) else 200)
err = Console(stderr=True, highlight=False, width=None if is_terminal(sys.stderr) else 200)


@contextlib.contextmanager
def status(message: str, quiet: bool = False) -> Iterator[Callable[[int, str], None]]:
    """A live status line on a terminal (nothing on a pipe), and a callback telling it each
    instance's phase (`children.PhaseCallback`)."""
    if quiet or not err.is_terminal:
        yield lambda index, phase: None
        return
    with err.status(message) as live:
        yield lambda index, phase: live.update(f"{message}: {phase}")


def new_table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", show_lines=False)
    for i, column in enumerate(columns):
        table.add_column(column, overflow="fold", no_wrap=i == 0)
    return table


def doctor(report: Mapping[str, Any]) -> None:
    table = new_table("This machine", "what", "found")
    for key in ("cpu_model", "sockets", "physical_cores", "logical_cpus", "threads_per_core",
                "numa_nodes", "usable_cpus", "usable_physical_cores", "cpu_quota_cores",
                "torch", "onednn", "mkldnn_available"):
        table.add_row(key, str(report[key]))
    siblings = report["smt_siblings"]
    table.add_row("smt_siblings", ", ".join(f"{c}:{s}" for c, s in siblings.items()) or "none")
    table.add_row("isa", " ".join(f"{k}={'yes' if v else 'no'}" for k, v in report["isa"].items()))
    if report["isa_limits"]:
        table.add_row("isa_limits", " ".join(f"{k}={v}" for k, v in report["isa_limits"].items()))
    out.print(table)
    probe(report["probe"])
    out.print(f"timing floor: {report['timing_floor']['described']}", markup=False, soft_wrap=True)
    libs = new_table("Libraries", "library", "path", "install if missing")
    for name, info in report["libraries"].items():
        libs.add_row(name, info["path"] or "[red]missing[/red]", info["install"] or "")
    numactl = report["numactl"]
    state = numactl["path"] or "[red]missing[/red]"
    if numactl["path"] and not numactl["usable"]:
        state += f" [yellow](cannot bind here: {numactl['problem']}; taskset is used)[/yellow]"
    libs.add_row("numactl", state, numactl["install"] or "")
    libs.add_row("taskset", report["taskset"] or "[red]missing[/red]", "")
    out.print(libs)
    found = [f"{name} {version}" for info in report["runtimes"].values() for name, version in info["versions"].items()
             if version]
    out.print(f"runtimes: {', '.join(dict.fromkeys(found)) or 'none'}")
    for backend, info in report["runtimes"].items():
        if info["install"]:
            out.print(f"[yellow]backend={backend} needs {info['name']}: {escape(info['install'])}[/yellow]")


def probe(data: Mapping[str, Any]) -> None:
    """The kernel probe: each runtime's precisions, their GOP/s per thread count, and whether a search offers them."""
    threads = data["threads"]
    table = new_table(f"What this CPU runs (kernel probe, {data['measured_at']})", "runtime", "precision", "op",
                      *(f"GOP/s {t}T" for t in threads), "x fp32", "rel. error", "offered")
    for kernel in data["kernels"]:
        gops = [f"{kernel['gops'][str(t)]:.0f}" if str(t) in kernel["gops"] else "-" for t in threads]
        ratio = f"{kernel['over_fp32']:.2f}" if kernel["over_fp32"] is not None else "-"
        error = f"{kernel['rel_error']:.4f}" if kernel["rel_error"] is not None else "-"
        verdict = "[red]no: " + escape(kernel["refusal"]) + "[/red]" if kernel["refusal"] else "yes"
        if kernel["remedy"]:
            verdict += f" ({kernel['remedy']}: 16-bit sums saturate here)"
        table.add_row(kernel["runtime"], kernel["precision"], kernel["op"], *gops, ratio, error, verdict)
    out.print(table)
    if data["bandwidth"]:
        out.print("memory bandwidth (STREAM): " + ", ".join(
            f"{t} thread(s) copy {b['copy_gbs']:.1f} GB/s, triad {b['triad_gbs']:.1f} GB/s"
            for t, b in data["bandwidth"].items()))


def plan(data: Mapping[str, Any]) -> None:
    bench = data["bench"]
    config = " ".join(f"{k}={v}" for k, v in data["config"].items()) or "defaults"
    out.print(f"model {bench['model']}  batch {bench['batch_size']}  knobs: {config}  "
              f"binding: {data['binding']}")
    if data["cleared"]:
        out.print(f"[yellow]not passed to the benchmark (set in your shell): "
                  f"{', '.join(data['cleared'])}[/yellow]")
    table = new_table("Instances", "#", "cpus", "numa", "env", "command")
    for inst in data["instances"]:
        env = "\n".join(f"{k}={v}" for k, v in inst["env"].items()) or "(unchanged)"
        node = "-" if inst["numa_node"] is None else str(inst["numa_node"])
        table.add_row(str(inst["index"]), format_cpus(inst["cpus"]), node, env, " ".join(inst["command"]))
    out.print(table)


def bench_result(data: Mapping[str, Any]) -> None:
    result = data["result"]
    table = new_table("Result", "instance", "p50 ms", "p90 ms", "items/s", "peak RSS MB", "samples",
                   "status")
    for inst in result["instances"]:
        if inst["ok"]:
            table.add_row(str(inst["index"]), f"{inst['latency_p50_ms']:.2f}",
                          f"{inst['latency_p90_ms']:.2f}", f"{inst['throughput_ips']:.2f}",
                          f"{inst['peak_rss_mb']:.0f}", str(inst["samples"]), "ok")
        else:
            table.add_row(str(inst["index"]), "-", "-", "-", "-", "-",
                          f"[red]failed: {inst['reason']}[/red]")
    if result["ok"]:
        table.add_row("all", f"{result['latency_p50_ms']:.2f}", f"{result['latency_p90_ms']:.2f}",
                      f"{result['throughput_ips']:.2f}", f"{result['peak_rss_mb']:.0f}", "", "ok",
                      style="bold")
    out.print(table)
    for inst in result["instances"]:
        if inst.get("buckets"):
            each = ", ".join(f"{length} tokens {b['latency_p50_ms']:.2f} ({b['weight']:.0%}{spread_text(length, b)})"
                             for length, b in inst["buckets"].items())
            out.print(f"instance {inst['index']}, per bucket (p50 ms, share of requests): {each}; "
                      f"its p50 is of the rounds' weighted means")
    kept = next((i["setup"] for i in result["instances"] if "int8_kept_fp32" in i.get("setup", {})), None)
    if kept is not None:
        out.print(fallback_text(kept), markup=False)
    if result.get("generation"):
        out.print(generation_text(result["generation"], data.get("bandwidth_gbs")))
    if data.get("quality"):
        out.print(quality.describe(data["quality"]), markup=False)
    elif result["ok"] and any(GUARD_FIGURES & set(inst.get("setup", {})) for inst in result["instances"]):
        out.print(RANDOM_GUARD, markup=False, soft_wrap=True)
    if not result["ok"]:
        out.print(f"[red]Failed: {result['reason']}[/red]")
        for inst in result["instances"]:
            if not inst["ok"] and inst.get("stderr_tail"):
                out.print(f"--- instance {inst['index']} output (tail) ---")
                out.print(inst["stderr_tail"].rstrip(), markup=False)


GUARD_FIGURES = {"max_rel_err", "min_cosine", "mean_cosine"}  # what a guarded configuration's setup records
RANDOM_GUARD = ("quality: the guard compared the answers with fp32 eager's on random inputs, not on your data; "
                "--eval-data judges accuracy or perplexity on it (docs/quality.md)")


def fallback_text(setup: Mapping[str, Any]) -> str:
    """int8_fallback: the layers kept in fp32, the divergence from fp32 without and with them, the ranking's cost."""
    kept = setup["int8_kept_fp32"]
    said = f"int8_fallback: kept in fp32 {', '.join(kept) if kept else 'no layer (none to keep)'}"
    if "int8_divergence" in setup and "int8_divergence_full" in setup:
        said += (f"; KL divergence from fp32 on the calibration batches {setup['int8_divergence_full']:.3g} with "
                 f"every layer int8, {setup['int8_divergence']:.3g} with these kept")
    ranking = setup.get("int8_ranking") or {}
    if ranking:
        how = "read from the cache" if ranking.get("reused") else "ranked here"
        said += (f"; {ranking.get('layers')} layers, {ranking.get('reverted')} reverted one by one, "
                 f"{how} (ranking took {ranking.get('took_s')} s)")
    return said


def generation_text(found: Mapping[str, Any], bandwidth_gbs: float | None) -> str:
    """--task generate: time to first token, per output token, and the decode's share of the memory bandwidth."""
    from autotune.study.efficiency import bandwidth_fraction

    tpot, ttft, tail = found.get("tpot_p50_ms"), found.get("ttft_p50_ms"), found.get("tpot_p90_ms")
    said = (f"generation (p50 over requests): time to first token {'-' if ttft is None else f'{ttft:.1f} ms'}, "
            f"per output token {'-' if tpot is None else f'{tpot:.2f} ms'}"
            + (f" ({1e3 / tpot:.1f} tokens/s decode{f'; p90 {tail:.2f} ms' if tail else ''})" if tpot else ""))
    if tpot and bandwidth_gbs and found.get("weight_bytes"):
        limit = bandwidth_fraction(0, float(found["weight_bytes"]), float(tpot), float(bandwidth_gbs))
        said += (f"; a decode step reads {limit['weight_gb']:.2f} GB of weights: {limit['read_gbs']:.1f} GB/s, "
                 f"{limit['fraction']:.0%} of the {limit['bandwidth_gbs']:.1f} GB/s this CPU measured "
                 f"(at most {limit['ceiling_tokens_per_s']:.1f} tokens/s)")
    return said


def spread_text(bucket: str, recorded: Mapping[str, Any]) -> str:
    """Where a bucket was timed at lengths spread over its requests (a model that takes any length),
    which: their mean is the bucket's figure."""
    lengths = recorded.get("lengths") or [int(bucket)]
    return "" if lengths == [int(bucket)] else f"; mean of {'/'.join(map(str, lengths))} tokens"


def models(names: Iterable[str], aliases: Mapping[str, str]) -> None:
    out.print("Models: " + ", ".join(sorted(names)))
    out.print("Short names: " + ", ".join(f"{k} -> {v}" for k, v in sorted(aliases.items())))


def search_summary(body: Mapping[str, Any]) -> None:
    """The end of a search (`summaries.search`): best trials, the winner against the experts, the cost."""
    from autotune.deploy.export import recipe_words  # optuna loads only for the commands that need it

    best_table(body["study"], body["objective"], body["best"], body["storage"])
    if body.get("speed_vs_quality"):
        quality_front(body["speed_vs_quality"], body.get("max_quality_drop"))
    else:
        out.print(RANDOM_GUARD, soft_wrap=True, highlight=False, markup=False)
    if body["versus_recipes"]:
        out.print(recipe_words(body["versus_recipes"]), soft_wrap=True, highlight=False, markup=False)
    for host, remeasured in (body.get("baseline_remeasured") or {}).items():
        out.print(_remeasured(host, remeasured), soft_wrap=True, highlight=False, markup=False)
    if body["accounting"]:
        accounting(body["accounting"])
    if body.get("warm_start"):
        warm_start(body["warm_start"])
    if body["efficiency"]:
        from autotune.study.efficiency import words

        out.print(f"against this CPU: {words(body['efficiency'])}", soft_wrap=True, highlight=False, markup=False)


def _remeasured(host: str, remeasured: Mapping[str, Any]) -> str:
    """A baseline measured on a noisy window and again, in one line (`records.remeasured_baselines`)."""
    was, last = remeasured["was"], remeasured["attempts"][-1]
    said = (f"baseline on {host}: measured on a noisy window ({was['noisy_reason']}) at p50 "
            f"{was['latency_p50_ms']:.2f} ms, again {len(remeasured['attempts'])}x")
    if remeasured["quiet"]:
        return f"{said}, quietly at {last['latency_p50_ms']:.2f} ms: the speedups shown are over that"
    return f"{said}, never quietly: the speedups shown are over the first, noisy one"


def best_table(name: str, objective: str, trials: Iterable[Mapping[str, Any]], storage: str) -> None:
    title = "Pareto front (latency vs throughput)" if objective == "both" else "Best trials"
    table = new_table(f"{title} of study {name}", "trial", "knobs", "p50 ms", "p90 ms", "items/s",
                   "RSS MB", "latency x", "throughput x")
    for t in trials:
        knobs = t["config"] + (f" (recipe {t['recipe']})" if t["recipe"] else "")
        table.add_row(str(t["number"]), knobs, f"{t['latency_p50_ms']:.2f}",
                      f"{t['latency_p90_ms']:.2f}", f"{t['throughput_ips']:.2f}", f"{t['peak_rss_mb']:.0f}",
                      f"{t['speedup_latency'] or 1:.2f}", f"{t['speedup_throughput'] or 1:.2f}")
    out.print(table)
    out.print(f"export the best: autotune export best.env --study {name}", soft_wrap=True)
    if storage.startswith("sqlite:///"):
        path = os.path.relpath(storage[len("sqlite:///"):])
        shown = storage if path.startswith("..") else f"sqlite:///{path}"
        out.print(f"review:          optuna-dashboard {shown}", soft_wrap=True)


def _within(found: Mapping[str, Any], limit: float | None) -> str:
    """The table's word for `quality.against_limit`: yes (the whole interval), on its estimate, or no."""
    if limit is None:
        return "-"
    said = quality.against_limit(found, limit)
    return "no" if said.startswith("over") else "on its estimate" if "not shown" in said else "yes"


def quality_front(trials: Iterable[Mapping[str, Any]], limit: float | None) -> None:
    """Speed against quality on the user's data: the trials no other beats on both (`quality_records.quality_front`)."""
    rows = list(trials)
    first = rows[0]["quality"]
    kind, unit = first.get("metric", first["kind"]), first["unit"]
    table = new_table("Speed against quality (the trials no other is both faster and better than)", "trial", "knobs",
                      "p50 ms", "items/s", kind, "95% CI", f"drop{f' ({unit})' if unit else ''}", "drop 95% CI",
                      "within limit")
    for t in rows:
        found = t["quality"]
        shown = f"{found['value']:.2f}%" if found["kind"] == "accuracy" else f"{found['value']:.4g}"
        table.add_row(str(t["number"]), t["config"], f"{t['latency_p50_ms']:.2f}", f"{t['throughput_ips']:.2f}",
                      shown, "-".join(f"{x:.3g}" for x in found["interval"] or ()) or "-",
                      f"{found['drop']:+.4g}" if found["kind"] == "custom" else f"{found['drop']:+.2f}",
                      " to ".join(f"{x:+.2f}" for x in found["drop_interval"] or ()) or "-", _within(found, limit))
    out.print(table)


def warm_start(found: Mapping[str, Any]) -> None:
    """What the warm start enqueued and whether the best configuration came from it, in one line."""
    came = [f"trial {e['trial']} ({e['config']}, from study {e['study']})" for e in found["enqueued"]]
    best = ("the best trial measures one of them" if found["best_from_warm_start"]
            else "the best configuration came from the search itself")
    out.print(f"warm start: {'; '.join(came)}; {best} (first measured at trial {found['best_first_measured_at']})",
              soft_wrap=True, highlight=False, markup=False)


def accounting(numbers: Mapping[str, Any]) -> None:
    """What the study's searches cost, in one line (stored as the study's `accounting`)."""
    skipped, noisy = int(numbers.get("not_compiled", 0)), int(numbers.get("undecided", 0))
    more = [f"{skipped} more pruned before compiling"] * bool(skipped)
    more += [f"{noisy} undecided on noisy windows"] * bool(noisy)
    besides = f" (and {', '.join(more)})" if more else ""
    out.print(f"search cost: {numbers['trials']} trials, {numbers['distinct_configurations']} distinct "
              f"configurations{besides}, "
              f"{clock(numbers['wall_s'])} wall, {numbers['timed_s']:.0f} s of timed samples "
              f"({numbers['efficiency']:.0%} of the wall time), {numbers['trials_per_hour']:.0f} trials/hour",
              soft_wrap=True, highlight=False)
    parts = numbers.get("breakdown")
    if parts:
        out.print("where the wall time went: " + ", ".join(
            f"{name} {parts[key]:.0f} s" for key, name in (("build_s", "build and compile"), ("warmup_s", "warm-up"),
                                                           ("timed_s", "timed samples"),
                                                           ("undecided_s", "undecided attempts"),
                                                           ("other_s", "the rest"))),
                  soft_wrap=True, highlight=False)


def number(value: float | None, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.3f}{suffix}"


def cache(entries: Sequence[Any], chosen: Sequence[Any], pruned: Any, now: float) -> None:
    """The cache entries; with --prune, which ones went and which stayed, and why (`pruned`: what the
    prune did, None when nothing was removed: a listing, or --dry-run, which says what would go)."""
    if not entries:
        out.print("nothing cached here; searches and `autotune export --artifacts` fill it")
        return
    done = {e.path: "would remove" for e in chosen} if pruned is None else \
        {e.path: "removed" for e in pruned.removed} | {e.path: f"kept: cannot remove ({why})" for e, why in pruned.kept}
    table = new_table("cache", "kind", "model", "configuration", "size", "last used", "usable here", "kept by", "prune")
    for e in entries:
        table.add_row(e.kind, e.model, e.config, _bytes(e.size), _age(now - e.last_used),
                      "yes" if not e.unusable else f"no: {e.unusable}", ", ".join(e.kept_by) or "-",
                      done.get(e.path, ""))
    out.print(table)
    said = [f"{len(entries)} entries, {_bytes(sum(e.size for e in entries))}"]
    if pruned is not None:
        said.append(f"removed {len(pruned.removed)}, {_bytes(sum(e.size for e in pruned.removed))}")
        if pruned.kept:
            causes = "; ".join(dict.fromkeys(why for _, why in pruned.kept))
            said.append(f"kept {len(pruned.kept)} that could not be removed ({causes})")
    elif chosen:
        said.append(f"would remove {len(chosen)}, {_bytes(sum(e.size for e in chosen))}")
    out.print("; ".join(said))



def _bytes(size: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def _age(seconds: float) -> str:
    for unit, scale in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= scale:
            return f"{seconds / scale:.0f}{unit} ago"
    return "just now"


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"

