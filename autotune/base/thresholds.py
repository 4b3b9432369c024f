"""Every threshold a verdict or a flag rests on, named once: the statistics, pruning, the noise
flags, the CLI's defaults and its help all read them here, so no two copies can drift apart."""

from __future__ import annotations

# Verdicts (confirm, compare, the regression gate).
ALPHA = 0.05  # significance level of every paired verdict
MIN_EFFECT = 0.03  # smallest gain worth recommending, unless the user says otherwise
CONFIDENCE = 0.95  # of every interval printed as a CI

# A confirmation's sequential rounds (measure/sequential.py, search/confirm.py).
CONFIRM_ROUNDS = 20  # the most rounds a confirmation runs, its cap (--confirm-rounds, confirm --rounds)
LOOKS = 3  # at most this many looks at the rounds: ALPHA / 2 at the last, the other half shared by the others
LOOK_STEP = 2  # the fewest rounds between two looks: a cap close to the first look takes fewer looks
CONFIRM_SHARE = 1 / 3  # of --time-budget: the most a search's confirmation may take past its first look
CONFIRM_RERUNS = 2  # a confirmation run flagged noisy is run again at most this many times in its round

# Stopping a trial early (search/pruning.py), or not starting it (search/compile_skip.py).
MARGIN = 0.05  # worse by more than this (relative) counts; a hair behind stays for confirmation
MIN_REPLICATES = 2  # one disturbed process alone never prunes
GIVE_UP = (2.0, 1.5)  # after its k-th window, a warmed trial this many times worse than the best stops (GiveUp)
SKIP_COMPILE = GIVE_UP[-1]  # a new compile predicted this many times worse than the best is not run

# Flags on a measurement (measure/replicates.py). A window's spread is judged against this host's own
# floor (host/floor.py), measured; the limits below are on evidence that something else took CPU.
# Other processes' share of the CPUs, or the hypervisor's steal, above this in any replicate is
# flagged. A lone resnet18 bench on a quiet 2-CPU machine showed 0.01-0.02 (the rest of the system,
# autotune's own parent 0.002);
# two benches sharing the CPUs each see about 0.5 of them taken by the other, more on a busy host.
BUSY_MACHINE = 0.25
# The child's own CPU time over (window x its threads) below this in a replicate is flagged: it
# waited for CPUs someone else held (a neighbour using half of 2 CPUs left a 2-thread child 0.49);
# OpenMP threads spin while they wait for work, so a child alone on its CPUs stays near 1.
STARVED = 0.5
# A trial stopped early on a noisy window is measured again at most this many times (study/undecided.py),
# once a later trial found the machine quiet, or at the latest after this many trials (the k-th
# retry after 2^(k-1) times as many), so that a machine noisy all along still ends the search.
# Not at all when each of the last QUIET_HISTORY measured trials was disturbed: no quiet is in sight.
NOISY_RETRIES = 1
NOISY_RETRY_WAIT = 5
# The kernel probe, run beside other work (other processes' or steal's share above BUSY_MACHINE),
# runs again after NOISY_RETRY_WAIT seconds at most this many times; then it is used, not kept.
PROBE_RETRIES = 2
QUIET_HISTORY = 10
# Pooled IQR/median above this takes more replicates (at most `max_extra`), once this host's floor is
# known only where the windows are wider than it too (replicates.wider).
REMEASURE = 0.25

# A trial's autotune judged dead (base/processes.py): the process now holding its pid started more
# than this apart from the recorded start (psutil gives it to 1/100 s; boot time is read whole).
SAME_START_S = 0.1

# What the kernel probe must show for a precision to be offered on this CPU (host/capabilities.py).
# Relative error against fp32 on the probe's inputs, at most: bf16 measured 0.002-0.003 and int8
# 0.004-0.008 where they work; int8 whose 16-bit sums saturate 0.09, torchao's dynamic int8 on an
# AVX2-limited EPYC 0.36.
PROBE_AGREES = {"bf16": 0.02, "int8": 0.05}
# A precision this many times slower than fp32 at every thread count probed is not offered: bf16
# emulated on an AVX2-limited EPYC measured 5-33x slower.
PROBE_SLOWER = 2.0
