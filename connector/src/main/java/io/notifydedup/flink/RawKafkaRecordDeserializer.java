package io.notifydedup.flink;

import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.connector.kafka.source.reader.deserializer.KafkaRecordDeserializationSchema;
import org.apache.flink.kafka.shaded.org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.flink.types.Row;
import org.apache.flink.util.Collector;

/**
 * Passes every Kafka record through untouched, with where it came from, so that decoding (and
 * reporting what cannot be decoded) happens in one place, in Python, and nothing is dropped here.
 *
 * <p>Produces {@code Row(topic, partition, offset, value)}; a null value becomes an empty array.
 */
public final class RawKafkaRecordDeserializer implements KafkaRecordDeserializationSchema<Row> {
    private static final long serialVersionUID = 1L;
    private static final byte[] EMPTY = new byte[0];

    public static TypeInformation<Row> producedType() {
        return Types.ROW_NAMED(
                new String[] {"topic", "partition", "offset", "value"},
                Types.STRING,
                Types.INT,
                Types.LONG,
                Types.PRIMITIVE_ARRAY(Types.BYTE));
    }

    @Override
    public void deserialize(ConsumerRecord<byte[], byte[]> record, Collector<Row> out) {
        byte[] value = record.value() == null ? EMPTY : record.value();
        out.collect(Row.of(record.topic(), record.partition(), record.offset(), value));
    }

    @Override
    public TypeInformation<Row> getProducedType() {
        return producedType();
    }
}
