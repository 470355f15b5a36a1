"""`doctor`: every stage against one workload (measure.py), and the GPU step of that
workload measured on a CUDA device (gpustep.py)."""
