"""The dedup rule for services that do not run Flink, as a library: in process memory
(:class:`~operators.inprocess.memory.MemoryDedup`) or in Redis
(:class:`~operators.inprocess.redis.RedisDedup`). Both use the job's key derivation
(``operators.dedup_key``) and window rule (``operators.window``): a request is a repeat when the
latest accepted request of its dedup key is less than that request's window away.

Neither is exactly-once the way the Flink job is: a crash between the check and the send loses
or repeats what was in flight, and the memory engine forgets everything with its process.
"""

from operators.inprocess.memory import Check, MemoryDedup
from operators.inprocess.redis import RedisDedup

__all__ = ["Check", "MemoryDedup", "RedisDedup"]
