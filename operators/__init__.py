"""Pure, typed logic of the notification dedup pipeline: no Flink, no Kafka.

The Flink job in ``jobs/`` is a thin adapter over these modules.
"""
