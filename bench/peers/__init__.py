"""The peers the job is compared with; each runs as its own process (``python -m bench.peers.X``)."""
