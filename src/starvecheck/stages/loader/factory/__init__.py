"""`loader --factory`: the user's own pipeline swept over DataLoader settings, a stage
of its own (`factory` in the registry; its result reports under `loader`). The user's
code imported and called within bounds (load.py), one configuration read until its
figure is stable (configuration.py), the user's samples and batches (owndata.py), the
sweep and its figures (stage.py)."""
