package io.notifydedup.flink;

import io.notifydedup.contract.Contract;

import org.apache.flink.connector.kafka.lineage.DefaultKafkaDatasetFacet;
import org.apache.flink.connector.kafka.lineage.DefaultKafkaDatasetIdentifier;
import org.apache.flink.connector.kafka.lineage.KafkaDatasetFacet;
import org.apache.flink.connector.kafka.lineage.KafkaDatasetFacetProvider;
import org.apache.flink.connector.kafka.sink.KafkaRecordSerializationSchema;
import org.apache.flink.kafka.shaded.org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.flink.types.Row;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.Map;
import java.util.Optional;
import java.util.Set;

/**
 * Writes {@code Row(topic, key, value)} as it is: the Python operator has already chosen the
 * topic and encoded key and value, so one transactional sink carries every output topic and a
 * checkpoint commits all of them together.
 *
 * <p>It names the topics it may write (every topic of the contract with an outcome, under the
 * names {@link RouteOutcomes} is given): the sink's {@code POOLING} transaction naming finds the
 * transactions a failed run left open through the producers of those topics' partitions, and
 * aborts them on start. A record for any other topic is refused, as a transaction there would
 * not be found.
 */
public final class RoutedRecordSerializer
        implements KafkaRecordSerializationSchema<Row>, KafkaDatasetFacetProvider {
    private static final long serialVersionUID = 2L;

    private final ArrayList<String> topics;
    private transient Set<String> known;

    /** @param topicNames topic name by contract role, as {@link RouteOutcomes} takes them */
    public RoutedRecordSerializer(Map<String, String> topicNames) {
        this.topics = new ArrayList<>(Contract.packaged().outputTopicNames(topicNames));
    }

    @Override
    public ProducerRecord<byte[], byte[]> serialize(
            Row row, KafkaSinkContext context, Long timestamp) {
        String topic = (String) row.getField(0);
        if (known == null) {
            known = new HashSet<>(topics);
        }
        if (!known.contains(topic)) {
            throw new IllegalStateException("a record for " + topic + ", not an output topic " + topics);
        }
        byte[] key = (byte[]) row.getField(1);
        byte[] value = (byte[]) row.getField(2);
        return new ProducerRecord<>(topic, null, null, key, value);
    }

    @Override
    public Optional<KafkaDatasetFacet> getKafkaDatasetFacet() {
        return Optional.of(new DefaultKafkaDatasetFacet(DefaultKafkaDatasetIdentifier.ofTopics(topics)));
    }
}
