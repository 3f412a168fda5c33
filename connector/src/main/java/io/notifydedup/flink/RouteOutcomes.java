package io.notifydedup.flink;

import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.functions.RichFlatMapFunction;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.typeutils.ResultTypeQueryable;
import org.apache.flink.metrics.Counter;
import org.apache.flink.types.Row;
import org.apache.flink.util.Collector;

import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;

/**
 * Turns each decision of the Python dedup operator into the records it means, in the JVM, so the
 * Python side never encodes Avro on the hot path.
 *
 * <p>Input: the outcomes of one mini-batch as columns, {@code Row(kind[], dedup_key[], value[],
 * text[], time[], occurrence[])} (columns, since PyFlink's converters reuse one row object per
 * type); per outcome, value is the request
 * as read from Kafka (for {@link #INVALID}, the InvalidRecord Python wrote):
 *
 * <ul>
 *   <li>{@link #ACCEPTED}: a ChannelMessage per channel, on the channel's topic, or its priority
 *       lane for a high-priority request; Kafka key = user_id;
 *   <li>{@link #DUPLICATE}: a DuplicateNotice (text = the original's notification id, time = its
 *       event time, occurrence); Kafka key = dedup key;
 *   <li>{@link #LATE}: a LateNotice (time = the watermark, text = the reason); key = user_id;
 *   <li>{@link #INVALID}: the value as it is, without a key.
 * </ul>
 *
 * <p>Output {@code Row(topic, key, value)} for {@link RoutedRecordSerializer}. Counts what it
 * writes per topic ({@code topic.<name>.emitted}).
 */
public final class RouteOutcomes extends RichFlatMapFunction<Row, Row> implements ResultTypeQueryable<Row> {
    private static final long serialVersionUID = 1L;

    public static final int ACCEPTED = 0;
    public static final int DUPLICATE = 1;
    public static final int LATE = 2;
    public static final int INVALID = 3;

    private final String[] channelTopics;
    private final String[] priorityTopics;
    private final String duplicates;
    private final String late;
    private final String invalid;
    private transient Map<String, Counter> emitted;

    /**
     * @param topics push, sms, email, their three priority lanes, duplicates, late, invalid
     */
    public RouteOutcomes(String[] topics) {
        if (topics.length != 9) {
            throw new IllegalArgumentException("expected 9 output topics, got " + topics.length);
        }
        channelTopics = new String[] {topics[0], topics[1], topics[2]};
        priorityTopics = new String[] {topics[3], topics[4], topics[5]};
        duplicates = topics[6];
        late = topics[7];
        invalid = topics[8];
    }

    public static TypeInformation<Row> routedType() {
        return Types.ROW_NAMED(
                new String[] {"topic", "key", "value"},
                Types.STRING,
                Types.PRIMITIVE_ARRAY(Types.BYTE),
                Types.PRIMITIVE_ARRAY(Types.BYTE));
    }

    @Override
    public TypeInformation<Row> getProducedType() {
        return routedType();
    }

    @Override
    public void open(OpenContext openContext) {
        emitted = new HashMap<>();
        for (String[] group : new String[][] {channelTopics, priorityTopics, {duplicates, late, invalid}}) {
            for (String topic : group) {
                emitted.put(topic, getRuntimeContext().getMetricGroup().addGroup("topic", topic).counter("emitted"));
            }
        }
    }

    @Override
    public void flatMap(Row outcomes, Collector<Row> out) {
        Integer[] kinds = (Integer[]) outcomes.getField(0);
        String[] keys = (String[]) outcomes.getField(1);
        byte[][] values = (byte[][]) outcomes.getField(2);
        String[] texts = (String[]) outcomes.getField(3);
        Long[] times = (Long[]) outcomes.getField(4);
        Integer[] occurrences = (Integer[]) outcomes.getField(5);
        for (int i = 0; i < kinds.length; i++) {
            route(kinds[i], keys[i], values[i], texts[i], times[i], occurrences[i], out);
        }
    }

    private void route(int kind, String dedupKey, byte[] value, String text, long time, int occurrence, Collector<Row> out) {
        if (kind == INVALID) {
            emit(out, invalid, null, value);
            return;
        }
        RequestParser.Fields f = RequestParser.parse(value);
        if (f == null) {
            throw new IllegalStateException("the dedup operator passed on a request that does not parse");
        }
        switch (kind) {
            case ACCEPTED -> {
                byte[] user = f.userId.getBytes(StandardCharsets.UTF_8);
                String[] lanes = f.priority == Outputs.PRIORITY_HIGH ? priorityTopics : channelTopics;
                for (int channel : f.channels) {
                    emit(out, lanes[channel], user, Outputs.channelMessage(f, dedupKey, channel));
                }
            }
            case DUPLICATE -> emit(
                    out,
                    duplicates,
                    dedupKey.getBytes(StandardCharsets.UTF_8),
                    Outputs.duplicateNotice(f, dedupKey, text, time, occurrence));
            case LATE -> emit(out, late, f.userId.getBytes(StandardCharsets.UTF_8), Outputs.lateNotice(f, time, text));
            default -> throw new IllegalStateException("unknown outcome kind " + kind);
        }
    }

    private void emit(Collector<Row> out, String topic, byte[] key, byte[] value) {
        emitted.get(topic).inc();
        out.collect(Row.of(topic, key, value));
    }
}
