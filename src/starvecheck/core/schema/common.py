"""The label values more than one stage's figures carry, and more than one layer
reads: each spelled here once. A value one stage alone writes and reads stays in that
stage's module (its own words); tests/test_vocabulary.py finds any spelled twice.

`quantity` says what a figure is; the others under which conditions."""

from __future__ import annotations

# quantity: samples and bytes moved
SAMPLES_PER_S = "samples_per_s"  # io, loader, factory, starve, profile
BATCHES_PER_S = "batches_per_s"  # factory: batches, one figure a round
MB_PER_S = "mb_per_s"  # io, loader
FIRST_BATCH_S = "first_batch_s"  # loader, factory: from the iterator made to its first batch
EPOCH_START_S = "epoch_start_s"  # factory: the same, for each pass after the first
BATCH_BYTES = "batch_bytes"  # factory: the bytes of one batch handed over
WORKER_BATCHES = "worker_batches"  # factory: the batches each worker delivered
SAMPLES = "samples"  # attach: stacks sampled; pad: samples read
# quantity: judged (advice adds them where it completes a result)
RECOMMENDED_NUM_WORKERS = "recommended_num_workers"
EFFICIENCY = "efficiency"  # pad's padding efficiency; capacity's reading of it
VS_CURRENT = "vs_current"  # loader --factory: a configuration's rate over the current one's
VS_CURRENT_LOW = "vs_current_low"  # ... and its interval
VS_CURRENT_HIGH = "vs_current_high"
# What judging derives (core/model.Judged): a report of schema 2 holds them among its
# metrics; read back, they are left to judging to make again.
JUDGED = (RECOMMENDED_NUM_WORKERS, VS_CURRENT, VS_CURRENT_LOW, VS_CURRENT_HIGH)
# quantity: a step and its parts (profile, profile --trace, watch)
STEP_MS = "step_ms"
PHASE_MS = "phase_ms"
DATA_WAIT_SHARE = "data_wait_share"
GPU_IDLE_DATA_WAIT_SHARE = "gpu_idle_data_wait_share"  # watch on the device clock
# quantity: the CPU time of a sample (starve's own, measured)
SAMPLE_CPU_MS = "sample_cpu_ms"
# quantity: what else the machine does while measuring (probe/load.py's reading)
OTHERS_CPUS = "others_cpus"  # CPUs other processes took, on average
OTHERS_CPUS_EACH_S = "others_cpus_each_s"  # ... second by second

# pattern: the order io reads in
PATTERN_RANDOM = "random"
