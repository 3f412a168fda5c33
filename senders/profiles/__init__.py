"""User profiles: the document (``model``), changes to it (``updates``), and the contacts at rest
(``crypto``: encryption and lookup hash; ``sealed``: the stored rows). Pure: no store, no network."""
