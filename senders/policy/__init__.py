"""The senders' pure logic: statuses and their transitions, retry policy, circuit breaker, token bucket.

Nothing here touches Kafka, a database or the network; the adapters are in
``senders.runtime``, ``senders.store`` and ``senders.providers``.
"""
