"""`make bench`: the dedup job against its peers, side by side, on one broker and one dataset.

``python -m bench.run --quick`` (what ``make bench`` runs) or ``python -m bench.run`` (full).
See bench/README.md for what is measured and how.
"""
