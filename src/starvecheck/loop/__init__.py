"""`starvecheck.watch`: the user's own training loop, timed (the public Python API).

    timer.py     Watch: the iterator a `for` runs over (one pass), and the hooks
                 trainers call (begin_step/end_step, begin_pass/end_pass)
    times.py     LoopTimes: the per-step figures, the metrics made of them, their
                 encoding for the other ranks (RankTimes)
    ranks.py     under torch.distributed: the figures through the group's store,
                 rank 0's every-rank result; reads LoopTimes, never the timer
    cpu.py       the loop thread's wait for a CPU, the DataLoader workers' CPU
    trainers/    transformers' and Lightning's callbacks (public as
                 starvecheck.integrations)

The report is built, judged and rendered as a command's (starvecheck.advice.report,
advice/, render/). Not named `watch`: a subpackage `starvecheck.watch` would replace
the function `starvecheck.watch` on the package as soon as it was imported.
"""
