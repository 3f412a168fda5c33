package io.notifydedup.flink;

import org.apache.flink.api.common.eventtime.SerializableTimestampAssigner;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.types.Row;

import java.time.Duration;

/**
 * Reads {@code event_time} out of a schemaless Avro {@code NotificationRequest} inside the Kafka
 * source, so that watermarks are generated per Kafka partition (per split) with idleness.
 *
 * <p>A record that is not a well-formed request, or whose event time is implausibly far ahead of
 * the wall clock, gets {@link Long#MIN_VALUE}: bad input can never move the watermark. The
 * Python side routes those records to the invalid topic.
 */
public final class EventTimeAssigner implements SerializableTimestampAssigner<Row> {
    private static final long serialVersionUID = 1L;
    private static final int VALUE_FIELD = 3;

    private final long maxFutureMs;

    public EventTimeAssigner(long maxFutureMs) {
        this.maxFutureMs = maxFutureMs;
    }

    /** Bounded out-of-orderness per partition, idle partitions ignored after {@code idleMs}. */
    public static WatermarkStrategy<Row> strategy(long outOfOrdernessMs, long idleMs, long maxFutureMs) {
        WatermarkStrategy<Row> strategy =
                WatermarkStrategy.<Row>forBoundedOutOfOrderness(Duration.ofMillis(outOfOrdernessMs))
                        .withTimestampAssigner(new EventTimeAssigner(maxFutureMs));
        return idleMs > 0 ? strategy.withIdleness(Duration.ofMillis(idleMs)) : strategy;
    }

    @Override
    public long extractTimestamp(Row row, long recordTimestamp) {
        return eventTime((byte[]) row.getField(VALUE_FIELD), System.currentTimeMillis() + maxFutureMs);
    }

    /** The request's event_time, or Long.MIN_VALUE when unusable. */
    static long eventTime(byte[] value, long latest) {
        RequestParser.Fields f = value == null ? null : RequestParser.parse(value);
        if (f == null || f.eventTime > latest) {
            return Long.MIN_VALUE;
        }
        return f.eventTime;
    }
}
