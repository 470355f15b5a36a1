"""The one writer: the scratch directory a run creates, fills and removes
(directory.py), the ownership markers it leaves (leftovers.py), and what `clean` may
remove of a killed run's, each thing proven first (claims.py: by name and place;
reclaim.py: on disk; inuse.py: open or mapped by no process). Imports only core/ and
probe/."""
