"""The user's files, read bounded and checked: a file before it is opened (files.py),
doctor's workload (workload.py), datasets, lengths files and tokenizers (text.py).
Outside input is untrusted: every reader here bounds bytes and time and refuses FIFOs
and devices where a file is meant. Imports only core/ and probe/."""
