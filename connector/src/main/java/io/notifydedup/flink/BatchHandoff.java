package io.notifydedup.flink;

import org.apache.flink.api.common.functions.RuntimeContext;

import java.util.ArrayDeque;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Hands each mini-batch's parsed requests from {@link ShardBatcher} to {@link RouteOutcomes}
 * around the Python dedup operator, which only sees the few columns its decision needs. The three
 * operators run chained in one task (one thread): the batcher registers a batch before emitting it,
 * Python answers each batch with exactly one row of verdicts, in order, and the router takes the
 * batch back by its sequence number. So the requests are parsed once and never cross into Python.
 *
 * <p>A queue per task attempt (job id, task name with subtask index, attempt): a restarted task
 * starts with an empty one. Nothing here is state: the batcher emits everything before a
 * checkpoint barrier, so every queue is empty at a checkpoint.
 */
final class BatchHandoff {
    /** One batch: its sequence number and its items ({@link Boundary#item()}). */
    record Batch(long seq, List<org.apache.flink.types.Row> items) {}

    private static final Map<String, ArrayDeque<Batch>> QUEUES = new ConcurrentHashMap<>();

    private BatchHandoff() {}

    static String taskKey(RuntimeContext ctx) {
        return ctx.getJobInfo().getJobId() + "/" + ctx.getTaskInfo().getTaskNameWithSubtasks();
    }

    /** The queue of this task attempt; queues of earlier attempts of the same task are dropped. */
    static ArrayDeque<Batch> queue(RuntimeContext ctx) {
        String task = taskKey(ctx);
        String key = task + "#" + ctx.getTaskInfo().getAttemptNumber();
        QUEUES.keySet().removeIf(k -> k.startsWith(task + "#") && !k.equals(key));
        return QUEUES.computeIfAbsent(key, k -> new ArrayDeque<>());
    }

    static void release(RuntimeContext ctx) {
        QUEUES.remove(taskKey(ctx) + "#" + ctx.getTaskInfo().getAttemptNumber());
    }
}
