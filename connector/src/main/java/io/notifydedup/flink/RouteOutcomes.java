package io.notifydedup.flink;

import io.notifydedup.contract.Contract;

import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.functions.RichFlatMapFunction;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.java.typeutils.ResultTypeQueryable;
import org.apache.flink.metrics.Counter;
import org.apache.flink.types.Row;
import org.apache.flink.util.Collector;

import java.util.ArrayDeque;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Turns the verdicts of the Python dedup operator into the records they mean, on their topics.
 *
 * <p>Input: the verdicts of one mini-batch, {@code Row(seq, column...)} ({@link Boundary#verdicts()});
 * the batch's items come back from {@link ShardBatcher} through {@link BatchHandoff}, in order. Per
 * item: an invalid one's InvalidRecord (encoded where it was read) on the invalid topic; a usable
 * one by its verdict's outcome (the contract's outcome names):
 *
 * <ul>
 *   <li>accepted: a ChannelMessage per channel, on the channel's topic in the request's lane; its
 *       traceparent is the verdict's (the decision's span) where Python traced it, else the request's;
 *   <li>duplicate: a DuplicateNotice naming the original it repeats;
 *   <li>late: a LateNotice with the watermark it was behind and why.
 * </ul>
 *
 * <p>Kafka keys are the contract's. Output {@code Row(topic, key, value)} for
 * {@link RoutedRecordSerializer}; counts what it writes per topic ({@code topic.<name>.emitted}), and the
 * invalid records ({@code invalid}).
 */
public final class RouteOutcomes extends RichFlatMapFunction<Row, Row> implements ResultTypeQueryable<Row> {
    private static final long serialVersionUID = 1L;

    private final Map<String, String> topicNames;
    private final long allowedLatenessMs;
    private transient Contract contract;
    private transient RequestParser parser;
    private transient Outputs outputs;
    private transient ArrayDeque<BatchHandoff.Batch> handoff;
    private transient Map<String, Counter> emitted;
    private transient Counter invalidCount;
    private transient String[][] laneTopics; // [lane of the request's priority][channel] -> topic name
    private transient Counter[][] laneCounters;
    private transient Contract.Topic[][] laneSpecs;
    private transient int accepted;
    private transient int duplicate;
    private transient int late;
    private transient int[] verdictColumn; // outcome, original id, first seen, occurrence, watermark, traceparent
    private transient int notificationIdField;
    private transient int traceparentField;
    private transient Contract.Topic duplicates;
    private transient Contract.Topic lates;
    private transient Contract.Topic invalids;

    /**
     * @param topicNames topic name by contract role (every role of schemas/contract.json)
     * @param allowedLatenessMs the dedup rule's allowed lateness, for the late notices' reason
     */
    public RouteOutcomes(Map<String, String> topicNames, long allowedLatenessMs) {
        this.topicNames = new HashMap<>(Contract.packaged().topicNames(topicNames));
        this.allowedLatenessMs = allowedLatenessMs;
    }

    public static TypeInformation<Row> routedType() {
        return Boundary.routed();
    }

    @Override
    public TypeInformation<Row> getProducedType() {
        return Boundary.routed();
    }

    @Override
    public void open(OpenContext openContext) {
        contract = Contract.packaged();
        parser = new RequestParser(contract, new Limits(Integer.MAX_VALUE, Map.of(), Integer.MAX_VALUE, Integer.MAX_VALUE, 0, 0));
        outputs = new Outputs(contract, parser);
        handoff = BatchHandoff.queue(getRuntimeContext());
        emitted = new HashMap<>();
        for (String name : contract.outputTopicNames(topicNames)) {
            emitted.put(name, getRuntimeContext().getMetricGroup().addGroup("topic", name).counter("emitted"));
        }
        List<String> priorities = parser.schema.fields().get(parser.priority).schema.symbols();
        List<String> channels = parser.schema.fields().get(parser.channels).schema.element.symbols();
        laneTopics = new String[priorities.size()][channels.size()];
        laneCounters = new Counter[priorities.size()][channels.size()];
        laneSpecs = new Contract.Topic[priorities.size()][channels.size()];
        for (int p = 0; p < priorities.size(); p++) {
            String lane = contract.laneOfPriority.get(priorities.get(p));
            if (lane == null) {
                throw new IllegalArgumentException("priority " + priorities.get(p) + " has no lane in the contract");
            }
            for (int c = 0; c < channels.size(); c++) {
                laneSpecs[p][c] = contract.channelTopic(channels.get(c), lane);
                laneTopics[p][c] = topicNames.get(laneSpecs[p][c].role);
                laneCounters[p][c] = emitted.get(laneTopics[p][c]);
            }
        }
        accepted = contract.outcome("accepted");
        duplicate = contract.outcome("duplicate");
        late = contract.outcome("late");
        String[] names = {"outcome", "original_notification_id", "first_seen_event_time", "occurrence", "watermark", "traceparent"};
        verdictColumn = new int[names.length];
        for (int i = 0; i < names.length; i++) {
            verdictColumn[i] = column(names[i]);
        }
        notificationIdField = parser.schema.require("notification_id");
        traceparentField = parser.schema.require("traceparent");
        duplicates = contract.topicForOutcome("duplicate");
        lates = contract.topicForOutcome("late");
        invalids = contract.topicForOutcome("invalid");
        invalidCount = getRuntimeContext().getMetricGroup().counter(invalids.outcome);
    }

    private int column(String name) {
        List<Contract.Column> spec = contract.verdictColumns;
        for (int i = 0; i < spec.size(); i++) {
            if (spec.get(i).name.equals(name)) {
                return i + 1;
            }
        }
        throw new IllegalArgumentException("no verdict column " + name + " in the contract");
    }

    @Override
    public void close() {
        if (handoff != null) {
            BatchHandoff.release(getRuntimeContext());
        }
    }

    @Override
    public void flatMap(Row verdicts, Collector<Row> out) {
        long seq = (Long) verdicts.getField(0);
        BatchHandoff.Batch batch = handoff.pollFirst();
        if (batch == null || batch.seq() != seq) {
            throw new IllegalStateException("verdicts of batch " + seq + " but the batch in hand is "
                    + (batch == null ? "none" : batch.seq()) + ": batch, dedup and route must run chained in one task");
        }
        Integer[] outcome = (Integer[]) verdicts.getField(verdictColumn[0]);
        String[] originalId = (String[]) verdicts.getField(verdictColumn[1]);
        Long[] firstSeen = (Long[]) verdicts.getField(verdictColumn[2]);
        Integer[] occurrence = (Integer[]) verdicts.getField(verdictColumn[3]);
        Long[] watermark = (Long[]) verdicts.getField(verdictColumn[4]);
        String[] traceparent = (String[]) verdicts.getField(verdictColumn[5]);
        int v = 0;
        for (Row item : batch.items()) {
            byte[] invalid = (byte[]) item.getField(Boundary.INVALID);
            if (invalid != null) {
                invalidCount.inc();
                emit(out, topicNames.get(invalids.role), null, invalid);
                continue;
            }
            Object[] request = RequestDeserializer.fields(item);
            String key = (String) item.getField(Boundary.KEY);
            int kind = outcome[v];
            if (kind == accepted) {
                if (traceparent[v] != null) {
                    request[traceparentField] = traceparent[v]; // the channel messages continue the decision's span
                }
                int priority = (Integer) request[parser.priority];
                for (Object channel : (List<?>) request[parser.channels]) {
                    int c = (Integer) channel;
                    Contract.Topic spec = laneSpecs[priority][c];
                    laneCounters[priority][c].inc();
                    out.collect(Row.of(laneTopics[priority][c], outputs.kafkaKey(spec, request, key),
                            outputs.channelMessage(request, key, c)));
                }
            } else if (kind == duplicate) {
                emit(out, topicNames.get(duplicates.role), outputs.kafkaKey(duplicates, request, key),
                        outputs.duplicateNotice(request, key, originalId[v], firstSeen[v], occurrence[v]));
            } else if (kind == late) {
                long t = (Long) request[parser.eventTime];
                String reason = "event_time " + t + " is behind the watermark " + watermark[v]
                        + " minus allowed lateness " + allowedLatenessMs + " ms";
                emit(out, topicNames.get(lates.role), outputs.kafkaKey(lates, request, key),
                        outputs.lateNotice(request, watermark[v], reason));
            } else {
                throw new IllegalStateException("unknown outcome " + kind + " for " + request[notificationIdField]);
            }
            v++;
        }
        if (v != outcome.length) {
            throw new IllegalStateException("batch " + seq + " has " + v + " requests but " + outcome.length + " verdicts");
        }
    }

    private void emit(Collector<Row> out, String topic, byte[] key, byte[] value) {
        emitted.get(topic).inc();
        out.collect(Row.of(topic, key, value));
    }
}
