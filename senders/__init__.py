"""The sender workers: drain the channel topics into providers, with retries, dead letters and a
status store. The logic they apply lives in ``senders.policy``; the rest of this package is the adapters."""
