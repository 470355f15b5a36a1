"""The user's files, read bounded and checked: a file before it is opened (files.py),
text read in bounded pieces and lines (streams.py), doctor's workload (workload.py),
`--factory` (factory.py), a lengths file (lengths.py), a dataset's records
(records.py) and samples (dataset.py), tokenizers (tokenizers.py), and the data
measured when the user gives none (embedded.py).
Outside input is untrusted: every reader here bounds bytes and time and refuses FIFOs
and devices where a file is meant. Imports only core/ and probe/."""
