"""Each stage's vocabulary, in one module per stage, that every layer imports: the
label values its figures carry, its parameters typed (a `Parameters` of its own), and
its nested records (`configurations`, `ranks`, `runs`, `gpus`) as dataclasses written
with `to_dict` and read back with `from_dict`. A stage's words are spelled here and
nowhere else (tests/test_vocabulary.py); its finding ids are core/catalogue.py's.

  common.py    the quantities and label values more than one stage's figures carry
  record.py    Record: a nested record's dataclass, written and read by its fields
  attach.py    attach: its ranks, its GPUs, what its figures count, a share as a record
  attachfigures.py  attach's figures as records (AttachFigures)
  factory.py   loader --factory: the `own` layout, the roles, each configuration read
  loader.py    loader and starve: the sweep's parameters; loader's figures as records
  starve.py    starve's figures as records
  samples.py   samples on disk (io, loader, profile): layouts, cache states, residency
  io.py, pad.py, pcie.py   those stages' parameters (io's, pcie's figures as records)
  steps.py     a step breakdown (profile, profile --trace, watch): runs and ranks
  machine.py   the machine record probe/ fills and render/ reads (Report.facts)
"""
