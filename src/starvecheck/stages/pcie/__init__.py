"""`pcie`: host <-> device bandwidth (stage.py runs the steps). host.py the plan and
the host's facts, measure.py the steps on a device, copies.py and bandwidth.py the
copies and their figures, cudart.py the ctypes reference, linkwatch.py the NVML
poller; the figures' records, their names and labels: core/schema/pcie.py."""
