"""The stages of loading a batch (core/schema/loading.py), timed where they happen.

  stamps.py  the worker side: the DataLoader's collate_fn and worker_init_fn wrapped,
             each batch's times written into a table in shared memory
  split.py   the arithmetic: one wait for a batch, split over the stages that were on
             its critical path (exposed), and each stage's time per batch (busy);
             pure functions of times
  tap.py     the training process's side: the wrappers set on a DataLoader while its
             iterator is made (and put back), which worker each batch came from, each
             step's wait split as it ends

Used by `starvecheck.watch` and the trainers' callbacks (loop/) and by `loader
--factory` (stages/loader/factory/); imports core/ and probe/ only, and torch only
where a DataLoader is already in hand.
"""
