package io.notifydedup.flink;

import org.apache.flink.connector.kafka.sink.KafkaRecordSerializationSchema;
import org.apache.flink.kafka.shaded.org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.flink.types.Row;

/**
 * Writes {@code Row(topic, key, value)} as it is: the Python operator has already chosen the
 * topic and encoded key and value, so one transactional sink carries every output topic and a
 * checkpoint commits all of them together.
 */
public final class RoutedRecordSerializer implements KafkaRecordSerializationSchema<Row> {
    private static final long serialVersionUID = 1L;

    @Override
    public ProducerRecord<byte[], byte[]> serialize(
            Row row, KafkaSinkContext context, Long timestamp) {
        String topic = (String) row.getField(0);
        byte[] key = (byte[]) row.getField(1);
        byte[] value = (byte[]) row.getField(2);
        return new ProducerRecord<>(topic, null, null, key, value);
    }
}
