package io.notifydedup.flink;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import org.apache.flink.types.Row;
import org.junit.jupiter.api.Test;

import java.util.List;
import java.util.Map;

class RoutedRecordSerializerTest {
    private static final Map<String, String> RENAMED = Map.of("push", "t.push", "requests", "t.requests");

    @Test
    void itNamesEveryOutputTopicForThePoolingNamingToFindOpenTransactions() {
        RoutedRecordSerializer serializer = new RoutedRecordSerializer(RENAMED);
        List<String> named = serializer.getKafkaDatasetFacet().orElseThrow().getTopicIdentifier().getTopics();
        // every topic with an outcome, under the names given; never the requests topic it reads
        assertEquals(List.of(
                "notifications.duplicates", "notifications.email", "notifications.email.priority",
                "notifications.invalid", "notifications.late", "notifications.push.priority",
                "notifications.sms", "notifications.sms.priority", "t.push"), named);
    }

    @Test
    void aRecordIsWrittenAsRoutedAndOneForAnotherTopicIsRefused() {
        RoutedRecordSerializer serializer = new RoutedRecordSerializer(RENAMED);
        byte[] key = {1};
        byte[] value = {2, 3};
        var record = serializer.serialize(Row.of("t.push", key, value), null, null);
        assertEquals("t.push", record.topic());
        assertArrayEquals(key, record.key());
        assertArrayEquals(value, record.value());
        assertThrows(IllegalStateException.class,
                () -> serializer.serialize(Row.of("t.requests", key, value), null, null));
        assertThrows(IllegalStateException.class,
                () -> serializer.serialize(Row.of("notifications.push", key, value), null, null));
    }
}
