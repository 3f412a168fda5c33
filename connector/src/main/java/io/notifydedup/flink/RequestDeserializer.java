package io.notifydedup.flink;

import io.notifydedup.contract.Contract;
import io.notifydedup.contract.Keys;

import org.apache.flink.api.common.serialization.DeserializationSchema;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.connector.kafka.source.reader.deserializer.KafkaRecordDeserializationSchema;
import org.apache.flink.kafka.shaded.org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.flink.types.Row;
import org.apache.flink.util.Collector;

import java.util.List;
import java.util.Map;

/**
 * Where a request enters the job, and the one place it is parsed ({@link RequestParser}). Emits
 * {@code Row(shard, item)} ({@link Boundary#sharded()}): for a usable request the item carries its
 * resolved dedup key, where it was read and its fields; for any other record the InvalidRecord
 * already encoded, with the reason, so that no later operator (and no Python code) ever reads
 * untrusted bytes. Nothing is dropped here: every Kafka record gives exactly one element.
 */
public final class RequestDeserializer implements KafkaRecordDeserializationSchema<Row> {
    private static final long serialVersionUID = 1L;
    private static final byte[] EMPTY = new byte[0];

    private final Limits limits;
    private final int shards;
    private transient RequestParser parser;
    private transient Keys keys;
    private transient Outputs outputs;
    private transient int userId;
    private transient int templateId;
    private transient int explicitKey;

    /**
     * @param limits what a usable request may be
     * @param shards the keyed-state shards dedup keys are spread over ({@code dedup.shards})
     */
    public RequestDeserializer(Limits limits, int shards) {
        if (shards < 1) {
            throw new IllegalArgumentException("shards must be positive");
        }
        this.limits = limits;
        this.shards = shards;
    }

    @Override
    public void open(DeserializationSchema.InitializationContext context) {
        Contract contract = Contract.packaged();
        parser = new RequestParser(contract, limits);
        keys = new Keys(contract);
        outputs = new Outputs(contract, parser);
        userId = parser.schema.require("user_id");
        templateId = parser.schema.require("template_id");
        explicitKey = parser.schema.require(contract.explicitKeyField);
    }

    @Override
    public void deserialize(ConsumerRecord<byte[], byte[]> record, Collector<Row> out) {
        out.collect(element(record.topic(), record.partition(), record.offset(),
                record.value() == null ? EMPTY : record.value(), System.currentTimeMillis()));
    }

    /** The element for one Kafka record, judged at wall-clock time {@code nowMs}. */
    Row element(String topic, int partition, long offset, byte[] value, long nowMs) {
        if (parser == null) {
            open(null);
        }
        RequestParser.Result r = parser.parse(value, nowMs);
        if (r.fields == null) {
            byte[] invalid = outputs.invalidRecord(value, limits.invalidRawPrefixBytes(), r.reason, topic, partition, offset);
            int shard = (int) Math.floorMod(offset, (long) shards);
            return Row.of(shard, Row.of(null, topic, partition, offset, null, invalid, null));
        }
        Object[] f = r.fields;
        @SuppressWarnings("unchecked")
        Map<String, ?> params = (Map<String, ?>) f[parser.params];
        String key = keys.dedupKey((String) f[explicitKey], (String) f[userId], (String) f[templateId], params);
        Row request = Boundary.row(parser.schema, f);
        return Row.of(Keys.shardOf(key, shards), Row.of(key, topic, partition, offset, request, null, Keys.keyHash(key)));
    }

    @Override
    public TypeInformation<Row> getProducedType() {
        return Boundary.sharded();
    }

    /** The fields of an item's request, as {@link RequestParser} gave them. */
    static Object[] fields(Row item) {
        Row request = (Row) item.getField(Boundary.REQUEST);
        Object[] f = new Object[request.getArity()];
        for (int i = 0; i < f.length; i++) {
            f[i] = request.getField(i);
        }
        return f;
    }

    static List<?> channels(Object[] fields, RequestParser parser) {
        return (List<?>) fields[parser.channels];
    }
}
