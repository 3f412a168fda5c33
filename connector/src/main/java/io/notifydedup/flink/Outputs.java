package io.notifydedup.flink;

import io.notifydedup.contract.AvroSchema;
import io.notifydedup.contract.AvroWriter;
import io.notifydedup.contract.Contract;
import io.notifydedup.contract.Keys;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * The records the job writes, encoded in the JVM (the only encoder of the job's output), field by
 * field as their schemas define them. A field the outcome determines is given by name; every other
 * field of an output schema is filled from the request's field of the same name, so a field added
 * to a request and to the channel message in schemas/ flows through with no code change. A field
 * that can be filled neither way (or whose types differ) stops the job at start with its name.
 */
final class Outputs {
    /** Fills one output schema: for each of its fields, an explicit value's slot or a request field. */
    private static final class Plan {
        final AvroSchema schema;
        final String[] explicit;
        final int[] slot; // index into the explicit values, or -1
        final int[] fromRequest; // index into the request's fields, or -1

        Plan(AvroSchema schema, AvroSchema request, String... explicit) {
            this.schema = schema;
            this.explicit = explicit;
            List<AvroSchema.Field> fields = schema.fields();
            slot = new int[fields.size()];
            fromRequest = new int[fields.size()];
            List<String> names = Arrays.asList(explicit);
            for (AvroSchema.Field f : fields) {
                slot[f.pos] = names.indexOf(f.name);
                fromRequest[f.pos] = -1;
                if (slot[f.pos] >= 0) {
                    continue;
                }
                int r = request.indexOf(f.name);
                if (r < 0 || !request.fields().get(r).schema.sameShape(f.schema)) {
                    throw new IllegalArgumentException(schema.name + "." + f.name
                            + " is neither given by the outcome nor a request field of the same type");
                }
                fromRequest[f.pos] = r;
            }
            for (String name : explicit) {
                schema.require(name);
            }
        }

        byte[] encode(Object[] request, Object... values) {
            Object[] out = new Object[slot.length];
            for (int i = 0; i < slot.length; i++) {
                out[i] = slot[i] >= 0 ? values[slot[i]] : request[fromRequest[i]];
            }
            return AvroWriter.write(schema, out);
        }
    }

    private final Keys keys;
    private final RequestParser parser;
    private final List<String> messageKeyParts;
    private final List<String> channelSymbols;
    private final Plan channelMessage;
    private final Plan duplicateNotice;
    private final Plan lateNotice;
    private final Plan invalidRecord;

    Outputs(Contract contract, RequestParser parser) {
        this.keys = new Keys(contract);
        this.parser = parser;
        AvroSchema request = parser.schema;
        AvroSchema channelEnum = request.fields().get(parser.channels).schema.element;
        channelSymbols = channelEnum.symbols();
        messageKeyParts = new ArrayList<>(contract.messageKeyParts);
        channelMessage = new Plan(schemaOf(contract, "accepted"), request, "message_key", "channel", "dedup_key");
        if (!channelMessage.schema.field("channel").schema.sameShape(channelEnum)) {
            throw new IllegalArgumentException("ChannelMessage.channel and the request's channels differ");
        }
        duplicateNotice = new Plan(schemaOf(contract, "duplicate"), request,
                "dedup_key", "original_notification_id", "first_seen_event_time", "occurrence");
        lateNotice = new Plan(schemaOf(contract, "late"), request, "request", "watermark", "reason");
        if (!lateNotice.schema.field("request").schema.sameShape(request)) {
            throw new IllegalArgumentException("LateNotice.request is not the request's schema");
        }
        invalidRecord = new Plan(schemaOf(contract, "invalid"), request,
                "raw", "raw_length", "raw_sha256", "error", "topic", "partition", "offset");
        for (String part : messageKeyParts) {
            if (!part.equals("dedup_key") && !part.equals("channel")) {
                request.require(part);
            }
        }
    }

    private static AvroSchema schemaOf(Contract contract, String outcome) {
        for (Contract.Topic t : contract.topics) {
            if (outcome.equals(t.outcome)) {
                return contract.schema(t.schema);
            }
        }
        throw new IllegalArgumentException("no topic for outcome " + outcome);
    }

    /** The message key of a request on one channel: the contract's parts, by name. */
    String messageKey(Object[] request, String dedupKey, int channel) {
        Object[] parts = new Object[messageKeyParts.size()];
        for (int i = 0; i < parts.length; i++) {
            String part = messageKeyParts.get(i);
            parts[i] = switch (part) {
                case "dedup_key" -> dedupKey;
                case "channel" -> channelSymbols.get(channel);
                default -> request[parser.schema.require(part)];
            };
        }
        return keys.messageKey(parts);
    }

    /** The Kafka key a topic's contract entry names: a request field, the resolved dedup key, or none. */
    byte[] kafkaKey(Contract.Topic topic, Object[] request, String dedupKey) {
        if (topic.key == null) {
            return null;
        }
        Object v = topic.key.equals("dedup_key") ? dedupKey : request[parser.schema.require(topic.key)];
        return v == null ? null : v.toString().getBytes(StandardCharsets.UTF_8);
    }

    byte[] channelMessage(Object[] request, String dedupKey, int channel) {
        return channelMessage.encode(request, messageKey(request, dedupKey, channel), channel, dedupKey);
    }

    byte[] duplicateNotice(Object[] request, String dedupKey, String originalId, long firstSeen, int occurrence) {
        return duplicateNotice.encode(request, dedupKey, originalId, firstSeen, occurrence);
    }

    byte[] lateNotice(Object[] request, long watermark, String reason) {
        return lateNotice.encode(request, request, watermark, reason);
    }

    /** An InvalidRecord: at most {@code prefixBytes} of the record, with its whole length and SHA-256. */
    byte[] invalidRecord(byte[] raw, int prefixBytes, String error, String topic, int partition, long offset) {
        byte[] kept = raw.length <= prefixBytes ? raw : Arrays.copyOf(raw, prefixBytes);
        return invalidRecord.encode(null, kept, (long) raw.length, sha256(raw), error, topic, partition, offset);
    }

    static String sha256(byte[] raw) {
        try {
            byte[] d = MessageDigest.getInstance("SHA-256").digest(raw);
            StringBuilder sb = new StringBuilder(64);
            for (byte b : d) {
                sb.append(Character.forDigit((b >> 4) & 0xf, 16)).append(Character.forDigit(b & 0xf, 16));
            }
            return sb.toString();
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("SHA-256 is not available", e);
        }
    }
}
