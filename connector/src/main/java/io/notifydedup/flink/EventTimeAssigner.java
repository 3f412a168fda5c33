package io.notifydedup.flink;

import io.notifydedup.contract.Contract;

import org.apache.flink.api.common.eventtime.SerializableTimestampAssigner;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.types.Row;

import java.time.Duration;

/**
 * The event time of each element of {@link RequestDeserializer}, inside the Kafka source, so that
 * watermarks are generated per Kafka partition (per split) with idleness. The request was parsed
 * and checked already: an invalid one (undecodable, or its event time too far ahead of the clock)
 * gets {@link Long#MIN_VALUE}, so bad input and a producer's wrong clock never move the watermark.
 */
public final class EventTimeAssigner implements SerializableTimestampAssigner<Row> {
    private static final long serialVersionUID = 1L;

    private transient Integer eventTime; // resolved in the task (transient fields start empty there)

    /** Bounded out-of-orderness per partition, idle partitions ignored after {@code idleMs}. */
    public static WatermarkStrategy<Row> strategy(long outOfOrdernessMs, long idleMs) {
        WatermarkStrategy<Row> strategy =
                WatermarkStrategy.<Row>forBoundedOutOfOrderness(Duration.ofMillis(outOfOrdernessMs))
                        .withTimestampAssigner(new EventTimeAssigner());
        return idleMs > 0 ? strategy.withIdleness(Duration.ofMillis(idleMs)) : strategy;
    }

    @Override
    public long extractTimestamp(Row element, long recordTimestamp) {
        Row request = (Row) ((Row) element.getField(1)).getField(Boundary.REQUEST);
        if (request == null) {
            return Long.MIN_VALUE;
        }
        if (eventTime == null) {
            Contract c = Contract.packaged();
            eventTime = c.request().require(c.eventTimeField);
        }
        return (Long) request.getField(eventTime);
    }
}
