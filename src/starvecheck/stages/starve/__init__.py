"""`starve`: does the input pipeline keep up with the GPU? The stage, its figures and
doctor's plan (stage.py), the producer/consumer run over each worker count (sweep.py),
and the job it simulates with the two predictions of its wait (model.py)."""
