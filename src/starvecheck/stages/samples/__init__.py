"""Samples on disk, for every stage that reads them (io, loader, profile): how they
sit (layouts.py), written in each layout or sampled from the user's files
(sources.py, existing.py, mds.py), what one sweep writes (plan.py), the timed readers
(reads.py), the datasets DataLoader workers read (datasets.py), and the page cache
(cache.py: eviction and residency; residency.py: whether a cold run was cold)."""
