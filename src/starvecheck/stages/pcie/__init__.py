"""`pcie`: host <-> device bandwidth (stage.py runs the steps). host.py the plan and
the host's facts, measure.py the steps on a device, copies.py and bandwidth.py the
copies and their figures, cudart.py the ctypes reference, linkwatch.py the NVML
poller, names.py the metrics' names and labels."""
