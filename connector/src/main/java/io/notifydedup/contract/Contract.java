package io.notifydedup.contract;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;

import java.io.IOException;
import java.io.InputStream;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The data contract as the JVM operators read it: {@code schemas/contract.json} and the
 * {@code .avsc} files beside it, packaged into the connector jar by pom.xml. Python reads the same
 * files (operators/contract.py); nothing of either is restated in code.
 */
public final class Contract implements Serializable {
    private static final long serialVersionUID = 1L;
    /** Where pom.xml puts schemas/ inside the jar. */
    public static final String RESOURCES = "/io/notifydedup/schemas/";
    private static final Pattern NAMED_TYPE = Pattern.compile("unknown Avro type (\\S+)");
    private static volatile Contract packaged;

    /** One topic of the contract, by role. */
    public static final class Topic implements Serializable {
        private static final long serialVersionUID = 1L;
        public final String role;
        public final String name;
        public final String schema;
        /** The request field the Kafka key is, {@code dedup_key} (the resolved key), or null: no key. */
        public final String key;
        public final String outcome;
        public final String channel;
        public final String lane;

        Topic(JsonNode n) {
            role = n.path("role").asText();
            name = n.path("name").asText();
            schema = n.path("schema").asText();
            key = text(n, "key");
            outcome = text(n, "outcome");
            channel = text(n, "channel");
            lane = text(n, "lane");
        }
    }

    /** One column that crosses the JVM/Python boundary. */
    public static final class Column implements Serializable {
        private static final long serialVersionUID = 1L;
        public final String name;
        public final String type;
        public final boolean nullable;

        Column(JsonNode n) {
            name = n.path("name").asText();
            type = n.path("type").asText();
            nullable = n.path("nullable").asBoolean(false);
        }
    }

    private final Map<String, AvroSchema> schemas = new HashMap<>();
    private final Map<String, AvroSchema> named = new HashMap<>();
    private final transient Loader loader;
    public final List<Topic> topics = new ArrayList<>();
    public final List<String> outcomes = new ArrayList<>();
    public final Map<String, String> laneOfPriority = new HashMap<>();
    public final List<Column> batchColumns = new ArrayList<>();
    public final List<Column> verdictColumns = new ArrayList<>();
    public final String requestSchema;
    public final String eventTimeField;
    public final String channelsField;
    public final String priorityField;
    public final List<String> requiredText = new ArrayList<>();
    public final List<String> nonEmpty = new ArrayList<>();
    public final String explicitKeyField;
    public final List<String> derivedFrom = new ArrayList<>();
    public final String keySeparator;
    public final String keyDigest;
    public final int keyHexChars;
    public final List<String> messageKeyParts = new ArrayList<>();
    public final String messageKeySeparator;

    /** Reads a file of the contract by name ("contract.json", "channel_message.avsc"). */
    public interface Loader {
        InputStream open(String file) throws IOException;
    }

    public Contract(Loader loader) {
        this.loader = loader;
        JsonNode c = json("contract.json");
        JsonNode req = c.path("request");
        requestSchema = req.path("schema").asText();
        eventTimeField = req.path("event_time").asText();
        channelsField = req.path("channels").asText();
        priorityField = req.path("priority").asText();
        req.path("required_text").forEach(n -> requiredText.add(n.asText()));
        req.path("non_empty").forEach(n -> nonEmpty.add(n.asText()));
        JsonNode key = c.path("dedup_key");
        explicitKeyField = key.path("explicit").asText();
        key.path("derived_from").forEach(n -> derivedFrom.add(n.asText()));
        keySeparator = key.path("separator").asText();
        keyDigest = key.path("digest").asText();
        keyHexChars = key.path("hex_chars").asInt();
        JsonNode mk = c.path("message_key");
        mk.path("parts").forEach(n -> messageKeyParts.add(n.asText()));
        messageKeySeparator = mk.path("separator").asText();
        c.path("lanes").fields().forEachRemaining(e -> e.getValue().forEach(p -> laneOfPriority.put(p.asText(), e.getKey())));
        c.path("topics").forEach(n -> topics.add(new Topic(n)));
        c.path("outcomes").forEach(n -> outcomes.add(n.asText()));
        c.path("boundary").path("batch").forEach(n -> batchColumns.add(new Column(n)));
        c.path("boundary").path("verdicts").forEach(n -> verdictColumns.add(new Column(n)));
        for (Topic t : topics) {
            schema(t.schema);
        }
    }

    /** The contract packaged into this jar (read once per class loader). */
    public static Contract packaged() {
        Contract c = packaged;
        if (c == null) {
            synchronized (Contract.class) {
                c = packaged;
                if (c == null) {
                    c = new Contract(file -> {
                        InputStream in = Contract.class.getResourceAsStream(RESOURCES + file);
                        if (in == null) {
                            throw new IOException("no " + RESOURCES + file + " in the connector jar");
                        }
                        return in;
                    });
                    packaged = c;
                }
            }
        }
        return c;
    }

    /** The schema of {@code schemas/<stem>.avsc}; a named type it refers to is read from its own file. */
    public synchronized AvroSchema schema(String stem) {
        AvroSchema s = schemas.get(stem);
        if (s != null) {
            return s;
        }
        JsonNode node = json(stem + ".avsc");
        while (true) {
            try {
                s = AvroSchema.parse(node, named, null);
                schemas.put(stem, s);
                return s;
            } catch (IllegalArgumentException e) {
                Matcher m = NAMED_TYPE.matcher(String.valueOf(e.getMessage()));
                if (!m.find() || schemas.containsKey(stemOf(m.group(1)))) {
                    throw e;
                }
                schema(stemOf(m.group(1)));
            }
        }
    }

    /** NotificationRequest -> notification_request: a named type lives in the file of its snake-case name. */
    static String stemOf(String typeName) {
        String simple = typeName.substring(typeName.lastIndexOf('.') + 1);
        return simple.replaceAll("([a-z0-9])([A-Z])", "$1_$2").toLowerCase();
    }

    public AvroSchema request() {
        return schema(requestSchema);
    }

    public Topic topic(String role) {
        for (Topic t : topics) {
            if (t.role.equals(role)) {
                return t;
            }
        }
        throw new IllegalArgumentException("no topic role " + role + " in the contract");
    }

    /** The role of the topic for an outcome (duplicate, late, invalid). */
    public Topic topicForOutcome(String outcome) {
        for (Topic t : topics) {
            if (outcome.equals(t.outcome) && t.channel == null) {
                return t;
            }
        }
        throw new IllegalArgumentException("no topic for outcome " + outcome);
    }

    /** The channel topic of a channel and lane. */
    public Topic channelTopic(String channel, String lane) {
        for (Topic t : topics) {
            if (channel.equals(t.channel) && lane.equals(t.lane)) {
                return t;
            }
        }
        throw new IllegalArgumentException("no topic for channel " + channel + " on lane " + lane);
    }

    public int outcome(String name) {
        int i = outcomes.indexOf(name);
        if (i < 0) {
            throw new IllegalArgumentException("no outcome " + name + " in the contract");
        }
        return i;
    }

    /** Role -> topic name: the contract's defaults, with {@code overrides} (by role) applied. */
    public Map<String, String> topicNames(Map<String, String> overrides) {
        Map<String, String> out = new LinkedHashMap<>();
        for (Topic t : topics) {
            out.put(t.role, t.name);
        }
        for (Map.Entry<String, String> e : overrides.entrySet()) {
            if (!out.containsKey(e.getKey())) {
                throw new IllegalArgumentException("no topic role " + e.getKey() + " in the contract");
            }
            out.put(e.getKey(), e.getValue());
        }
        return out;
    }

    /** The names of the topics the job writes (those with an outcome), sorted; {@code overrides} as in {@link #topicNames}. */
    public List<String> outputTopicNames(Map<String, String> overrides) {
        Map<String, String> names = topicNames(overrides);
        TreeSet<String> out = new TreeSet<>();
        for (Topic t : topics) {
            if (t.outcome != null) {
                out.add(names.get(t.role));
            }
        }
        return new ArrayList<>(out);
    }

    private JsonNode json(String file) {
        try (InputStream in = loader.open(file)) {
            return new ObjectMapper().readTree(in);
        } catch (IOException e) {
            throw new UncheckedIOException("cannot read " + file + " of the contract", e);
        }
    }

    private static String text(JsonNode n, String field) {
        JsonNode v = n.get(field);
        return v == null || v.isNull() ? null : v.asText();
    }
}
