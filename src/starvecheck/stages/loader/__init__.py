"""`loader`: samples per second through a real DataLoader (stage.py), and its
own-pipeline mode, a stage of its own: `loader --factory` (factory/)."""
