"""Versioned, translated message templates: the directory and its validation (``catalog``, which
documents the layout), rendering (``render``), SMS segments (``sms``). The repository's own
templates, the ones the demo uses, are in the top-level ``templates/`` directory."""
