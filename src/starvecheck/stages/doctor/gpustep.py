"""The GPU step of a workload, measured: GPT-2 small (stages/trainstep.py, random
weights, nothing downloaded) trained on random token ids at the workload's batch size
and context, on the CUDA device, in bf16 mixed precision (autocast) where the device
supports it, as models are trained on such GPUs (fp32 otherwise; the report says which).
On a lent H100 the fp32 step took 354 ms and the bf16 one 129 ms (batch 16 x 1,024):
measured in fp32, the GPU's demand for samples would be understated almost threefold.

GPT-2 has 1,024 positions, so a longer context is measured at 1,024 tokens; a batch
that does not fit in GPU memory is halved until it does. Either way the report says
what was measured, and the step time is scaled to the workload's batch size
(samples per second is what the chain compares, and it is the measured figure).
"""

from __future__ import annotations

from dataclasses import dataclass

from starvecheck.core import clocks
from starvecheck.core.metric import Metric
from starvecheck.core.signals import importing
from starvecheck.core.status import Unavailable

GPT2_POSITIONS = 1024


@dataclass(frozen=True)
class Measured:
    step_ms: Metric  # per step at `batch` x `seq_len`
    batch: int
    seq_len: int
    scaled_ms: float  # the step time scaled to the workload's batch size
    description: str


def measure(batch_size: int, context: int, quick: bool) -> Measured:
    with importing("torch"):
        import torch

    from starvecheck.stages.trainstep import MODEL_SIZES, build_model

    if not torch.cuda.is_available():
        raise Unavailable("measuring the GPU step needs a CUDA device; give --step-ms")
    seq = min(context, GPT2_POSITIONS)
    model, optimizer = build_model("base", "cuda")
    vocab = MODEL_SIZES["base"][3]
    warmup, steps = (2, 5) if quick else (3, 20)
    bf16 = bool(torch.cuda.is_bf16_supported())
    precision = "bf16 autocast" if bf16 else "fp32"
    batch = batch_size
    try:
        while True:
            try:
                times = _time_steps(model, optimizer, batch, seq, vocab, warmup, steps, bf16)
                break
            except torch.cuda.OutOfMemoryError:
                optimizer.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                if batch == 1:
                    raise Unavailable(
                        "GPT-2 small does not fit in GPU memory at batch 1; give --step-ms"
                    ) from None
                batch //= 2
    finally:
        del model, optimizer
        torch.cuda.empty_cache()
    metric = Metric.repeated("gpu_step_ms", times, "ms")
    assert metric.value is not None
    scaled = metric.value * batch_size / batch
    what = (
        f"GPT-2 small (124M, random weights) training steps in {precision} at batch "
        f"{batch} x {seq} tokens"
    )
    if seq < context:
        what += f" (GPT-2 has {GPT2_POSITIONS:,} positions; the context is {context:,})"
    if batch < batch_size:
        what += f", scaled to batch {batch_size} (batch {batch_size} did not fit)"
    what += f" on {torch.cuda.get_device_name()}: {warmup} warm-up, median of {steps}"
    return Measured(metric, batch, seq, scaled, what)


def _time_steps(
    model: object,
    optimizer: object,
    batch: int,
    seq: int,
    vocab: int,
    warmup: int,
    steps: int,
    bf16: bool,
) -> list[float]:
    import contextlib

    with importing("torch"):
        import torch

    def precision() -> contextlib.AbstractContextManager[object]:
        if bf16:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    ids = torch.randint(0, vocab, (batch, seq), device="cuda")
    times = []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = clocks.perf_counter()
        with precision():
            loss = model(input_ids=ids, labels=ids).loss  # type: ignore[operator]
        loss.backward()
        optimizer.step()  # type: ignore[attr-defined]
        optimizer.zero_grad(set_to_none=True)  # type: ignore[attr-defined]
        torch.cuda.synchronize()
        if i >= warmup:
            times.append((clocks.perf_counter() - t0) * 1000)
    return times
