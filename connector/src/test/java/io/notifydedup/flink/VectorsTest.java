package io.notifydedup.flink;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;

import io.notifydedup.contract.Canonical;
import io.notifydedup.contract.Contract;
import io.notifydedup.contract.Keys;

import org.apache.flink.runtime.state.KeyGroupRangeAssignment;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.flink.types.Row;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** The JVM side of the contract against tests/vectors.json, which pytest checks Python against too. */
class VectorsTest {
    private static JsonNode vectors;
    private static Contract contract;
    private static Keys keys;
    private static RequestParser parser;
    private static Outputs outputs;
    private static RequestDeserializer deserializer;

    static Path repo() {
        return Path.of(System.getProperty("notifydedup.repo", "."));
    }

    @BeforeAll
    static void load() throws Exception {
        vectors = new ObjectMapper().readTree(Files.readString(repo().resolve("tests/vectors.json")));
        contract = Contract.packaged();
        keys = new Keys(contract);
        parser = new RequestParser(contract, Fixtures.limits());
        outputs = new Outputs(contract, parser);
        deserializer = new RequestDeserializer(Fixtures.limits(), 128);
    }

    static Map<String, String> params(JsonNode node) {
        Map<String, String> out = new LinkedHashMap<>();
        node.fields().forEachRemaining(e -> out.put(e.getKey(), e.getValue().asText()));
        return out;
    }

    static byte[] hex(JsonNode node) {
        return node == null || node.isNull() ? null : HexFormat.of().parseHex(node.asText());
    }

    @Test
    void canonicalJson() {
        for (JsonNode v : vectors.get("canonical_json")) {
            assertEquals(v.get("json").asText(), Canonical.json(params(v.get("params"))));
        }
    }

    @Test
    void derivedDedupKey() {
        for (JsonNode v : vectors.get("derived_key")) {
            String key = keys.dedupKey(null, v.get("user_id").asText(), v.get("template_id").asText(), params(v.get("params")));
            assertEquals(v.get("key").asText(), key, v.toString());
            assertEquals(key, keys.dedupKey("", v.get("user_id").asText(), v.get("template_id").asText(), params(v.get("params"))));
        }
    }

    @Test
    void shardOfAKey() {
        for (JsonNode v : vectors.get("shard")) {
            assertEquals(v.get("shard").asInt(), Keys.shardOf(v.get("key").asText(), v.get("shards").asInt()), v.toString());
        }
    }

    @Test
    void keyGroupOfAShard() {
        for (JsonNode v : vectors.get("key_group")) {
            int maxParallelism = v.get("max_parallelism").asInt();
            int keyGroup = KeyGroupRangeAssignment.assignToKeyGroup(v.get("shard").asInt(), maxParallelism);
            assertEquals(v.get("key_group").asInt(), keyGroup, v.toString());
            assertEquals(v.get("subtask").asInt(), KeyGroupRangeAssignment.computeOperatorIndexForKeyGroup(
                maxParallelism, v.get("parallelism").asInt(), keyGroup), v.toString());
        }
    }

    @Test
    void keyHashOfAKey() {
        for (JsonNode v : vectors.get("key_hash")) {
            assertEquals(v.get("hash").asLong(), Keys.keyHash(v.get("key").asText()), v.toString());
        }
    }

    @Test
    void recordsParsedOnceAndEncoded() {
        for (JsonNode v : vectors.get("records")) {
            byte[] raw = hex(v.get("request_hex"));
            Row element = deserializer.element("notifications.requests", 0, 7L, raw, Fixtures.NOW);
            Row item = (Row) element.getField(1);
            assertNull(item.getField(Boundary.INVALID), v.get("request").toString());
            String key = (String) item.getField(Boundary.KEY);
            assertEquals(v.get("dedup_key").asText(), key);
            assertEquals(Keys.shardOf(key, 128), element.getField(0));
            assertEquals(Keys.keyHash(key), item.getField(Boundary.KEY_HASH));
            Object[] request = RequestDeserializer.fields(item);
            List<?> channels = (List<?>) request[parser.channels];
            JsonNode messages = v.get("channel_messages");
            assertEquals(messages.size(), channels.size());
            Contract.Topic[] specs = new Contract.Topic[channels.size()];
            int priority = (Integer) request[parser.priority];
            String lane = contract.laneOfPriority.get(parser.schema.fields().get(parser.priority).schema.symbols().get(priority));
            for (int i = 0; i < channels.size(); i++) {
                int c = (Integer) channels.get(i);
                String channel = parser.schema.fields().get(parser.channels).schema.element.symbols().get(c);
                specs[i] = contract.channelTopic(channel, lane);
                JsonNode m = messages.get(i);
                assertEquals(m.get("topic_role").asText(), specs[i].role);
                assertArrayEquals(hex(m.get("key_hex")), outputs.kafkaKey(specs[i], request, key));
                assertArrayEquals(hex(m.get("value_hex")), outputs.channelMessage(request, key, c), m.toString());
            }
            JsonNode d = v.get("duplicate");
            Contract.Topic dup = contract.topicForOutcome("duplicate");
            assertArrayEquals(hex(d.get("key_hex")), outputs.kafkaKey(dup, request, key));
            assertArrayEquals(hex(d.get("value_hex")), outputs.duplicateNotice(request, key,
                    d.get("original_notification_id").asText(), d.get("first_seen_event_time").asLong(), d.get("occurrence").asInt()));
            JsonNode l = v.get("late");
            Contract.Topic late = contract.topicForOutcome("late");
            assertArrayEquals(hex(l.get("key_hex")), outputs.kafkaKey(late, request, key));
            assertArrayEquals(hex(l.get("value_hex")), outputs.lateNotice(request, l.get("watermark").asLong(), l.get("reason").asText()));
        }
    }

    @Test
    void messageKeys() {
        for (JsonNode v : vectors.get("message_key")) {
            Object[] request = new Object[parser.schema.fields().size()];
            request[parser.eventTime] = v.get("event_time").asLong();
            int channel = parser.schema.fields().get(parser.channels).schema.element.symbolIndex(v.get("channel").asText());
            assertEquals(v.get("message_key").asText(), outputs.messageKey(request, v.get("dedup_key").asText(), channel));
        }
    }

    @Test
    void invalidRecords() {
        for (JsonNode v : vectors.get("invalid_records")) {
            byte[] expected = hex(v.get("value_hex"));
            assertNotNull(expected);
            assertArrayEquals(expected, outputs.invalidRecord(hex(v.get("raw_hex")), v.get("prefix_bytes").asInt(),
                    v.get("error").asText(), v.get("topic").asText(), v.get("partition").asInt(), v.get("offset").asLong()));
        }
    }

    @Test
    void contractLoadsFromTheRepoToo() {
        Contract fromRepo = new Contract(file -> Files.newInputStream(repo().resolve("schemas").resolve(file)));
        assertEquals(contract.outcomes, fromRepo.outcomes);
        assertEquals(contract.topicNames(Map.of()), fromRepo.topicNames(Map.of()));
        assertEquals(new String("x".getBytes(StandardCharsets.UTF_8), StandardCharsets.UTF_8), "x");
    }
}
