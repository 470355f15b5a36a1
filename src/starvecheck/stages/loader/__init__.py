"""`loader`: samples per second through a real DataLoader (stage.py: the plan, the
data and the figures; epochs.py: each epoch timed batch by batch), and its own-pipeline
mode, a stage of its own: `loader --factory` (factory/)."""
