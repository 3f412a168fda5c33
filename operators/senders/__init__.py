"""The senders' pure logic: statuses and their transitions, retry policy, circuit breaker, token bucket.

Nothing here touches Kafka, a database or the network; ``dedupctl/senders`` holds the adapters.
"""
