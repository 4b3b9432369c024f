"""The compile skip replayed on a described 16-core host (issue 38): the default space adapted to 16
cores with bf16 and int8 (precisions fp32/bf16/int8, layouts contiguous/channels_last, 1-16
threads), and a fake measurement instead of processes.

The host, as described: each precision and layout has its own speed at one thread, and scales
with threads by Amdahl's law, with a serial share that differs by precision (int8's quantize and
dequantize steps scale worst, bf16's conversions next); at all 16 cores it is 10% slower (the
host's own processes share the cores), so the best runs fewer threads than the recipes; every
measurement carries multiplicative noise (3% log-normal, seeded). The search is the recipes at all
16 cores, then keys drawn at random, each measured unless `skip_compile` skips it. No key whose
true latency is within NEAR_BEST of the best true latency may be skipped."""

from __future__ import annotations

import math
import random

import optuna
import pytest

from autotune.config import space, space_fit
from autotune.config.knobs import Config
from autotune.search import compile_skip

CORES = 16
HOST = space_fit.adapt(space.load(space.find("default")), CORES, {"bf16": True, "int8": True})
HERE = "16-core"  # the class id the trials and the decisions are for
NEAR_BEST = 1.2  # a configuration this close to the best must never be skipped (the bar)
ONE_THREAD_MS = {("fp32", "contiguous"): 640.0, ("fp32", "channels_last"): 560.0,
                 ("bf16", "contiguous"): 300.0, ("bf16", "channels_last"): 260.0,
                 ("int8", "contiguous"): 220.0, ("int8", "channels_last"): 190.0}
SERIAL = {"fp32": 0.03, "bf16": 0.05, "int8": 0.08}  # Amdahl's serial share of a forward call
ALL_CORES = 1.10  # the slowdown at all the cores
NOISE = 0.03
RECIPES = (("fp32", "channels_last"), ("bf16", "channels_last"), ("int8", "channels_last"))


Key = tuple[str, str, int]  # precision, layout, threads: a compile_skip.CompileKey at shapes=buckets


def true_ms(key: Key) -> float:
    precision, layout, threads = key
    serial = SERIAL[precision]
    return ONE_THREAD_MS[(precision, layout)] * (serial + (1 - serial) / threads) * (ALL_CORES if threads == CORES
                                                                                       else 1.0)


KEYS = [(p, layout, t) for p, layout in ONE_THREAD_MS for t in range(1, CORES + 1)]
BEST_MS = min(true_ms(k) for k in KEYS)


def compiled(key: Key) -> Config:
    precision, layout, threads = key
    return Config.from_mapping({"backend": "inductor", "memory_format": layout, "precision": precision,
                                "omp_threads": threads})


def measure(study: optuna.Study, config: Config, value: float) -> None:
    study.enqueue_trial(HOST.params(config))
    trial = study.ask()
    HOST.sample(trial, only=config)
    trial.set_user_attr("host_class", HERE)
    study.tell(trial, value)


def opened(rng: random.Random, disturbed: float = 1.0) -> optuna.Study:
    """The baseline (eager at 16 threads) and the recipes, measured; bf16's recipe `disturbed`
    times slower than the host runs it (a busy window)."""
    study = optuna.create_study()
    measure(study, Config(), 1.6 * true_ms(("fp32", "contiguous", CORES)))
    for precision, layout in RECIPES:
        noise = disturbed if precision == "bf16" else math.exp(rng.gauss(0.0, NOISE))
        measure(study, Config.from_mapping({"backend": "inductor", "memory_format": layout, "precision": precision}),
                true_ms((precision, layout, CORES)) * noise)
    return study


def replay(seed: int, proposals: int = 80) -> list[tuple[Key, int | None]]:
    """Each proposed key, and the best trial's threads when it was skipped (None: measured)."""
    rng = random.Random(seed)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = opened(rng)
    decided: list[tuple[Key, int | None]] = []
    for _ in range(proposals):
        key = rng.choice(KEYS)
        skip = compile_skip.skip_compile(study, HOST, "latency", compiled(key), HERE)
        if skip is None:
            measure(study, compiled(key), true_ms(key) * math.exp(rng.gauss(0.0, NOISE)))
            decided.append((key, None))
        else:
            best = compile_skip.evidence(HOST, study.get_trials(), HERE).best
            assert best is not None
            decided.append((key, best.threads))
    return decided


def test_the_described_host_has_configurations_near_the_best_in_every_precision() -> None:
    near = {key[0] for key in KEYS if true_ms(key) <= NEAR_BEST * BEST_MS}
    assert near == {"bf16", "int8"}  # the bar is not met by skipping nothing close: bf16 is close
    threads = HOST.get("omp_threads")
    assert threads is not None and (threads.low, threads.high) == (1, CORES)


@pytest.mark.parametrize("seed", range(5))
def test_no_configuration_within_1_2x_of_the_best_is_skipped(seed: int) -> None:
    decided = replay(seed)
    skipped = [key for key, threads in decided if threads is not None]
    assert skipped, "the replay must exercise the skip"
    assert [key for key in skipped if true_ms(key) <= NEAR_BEST * BEST_MS] == []
    # and never a key at the best trial's thread count (every precision and layout compiles there)
    assert [key for key, threads in decided if threads is not None and key[2] == threads] == []


def test_a_disturbed_bf16_at_16_threads_no_longer_skips_every_bf16_key() -> None:
    """bf16's recipe measured 1.7x slower than the host runs it puts it past 1.5x the best: read as
    "no change" along the unmeasured thread steps, that skipped bf16 at 1 to 15 threads."""
    study = opened(random.Random(0), disturbed=1.7)
    best = compile_skip.evidence(HOST, study.get_trials(), HERE).best
    assert best is not None and study.get_trials()[2].values[0] > 1.5 * best.value
    for layout in ("channels_last", "contiguous"):
        for threads in range(1, CORES):
            assert compile_skip.skip_compile(study, HOST, "latency", compiled(("bf16", layout, threads)), HERE) is None
    # with int8's layout step measured at 16 threads, bf16 contiguous at 16 is predicted from the
    # disturbed recipe, past 1.5x the best; it compiles all the same, at the best trial's threads
    measure(study, compiled(("int8", "contiguous", CORES)), true_ms(("int8", "contiguous", CORES)))
    predicted = compile_skip.predict_compile(HOST, study.get_trials(), ("bf16", "contiguous", CORES, "buckets"), HERE)
    best = compile_skip.evidence(HOST, study.get_trials(), HERE).best
    assert best is not None and best.threads == CORES
    assert predicted is not None and predicted.value > 1.5 * best.value
    assert compile_skip.skip_compile(study, HOST, "latency", compiled(("bf16", "contiguous", CORES)), HERE) is None
