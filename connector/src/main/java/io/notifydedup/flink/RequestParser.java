package io.notifydedup.flink;

import io.notifydedup.contract.AvroReader;
import io.notifydedup.contract.AvroSchema;
import io.notifydedup.contract.Contract;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;

/**
 * Parses a {@code NotificationRequest} once, where it enters the job, and decides whether it can be
 * used: the schema (schemas/notification_request.avsc, walked by {@link AvroReader}), the
 * contract's required fields (schemas/contract.json) and the {@link Limits}. A usable request comes
 * back as its fields in schema order, normalized (each channel once, in first-seen order); any
 * other record as the reason, in words fit for {@code notifications.invalid}.
 */
final class RequestParser {
    /** A request's fields, or why there are none. */
    static final class Result {
        final Object[] fields;
        final String reason;

        private Result(Object[] fields, String reason) {
            this.fields = fields;
            this.reason = reason;
        }
    }

    final AvroSchema schema;
    final int eventTime;
    final int channels;
    final int priority;
    final int params;
    private final int[] requiredText;
    private final int[] nonEmpty;
    private final int[] limitedFields;
    private final int[] limitedBytes;
    private final Limits limits;

    RequestParser(Contract contract, Limits limits) {
        this.limits = limits;
        schema = contract.request();
        eventTime = schema.require(contract.eventTimeField);
        channels = schema.require(contract.channelsField);
        priority = schema.require(contract.priorityField);
        params = schema.require("params");
        requiredText = contract.requiredText.stream().mapToInt(schema::require).toArray();
        nonEmpty = contract.nonEmpty.stream().mapToInt(schema::require).toArray();
        List<Map.Entry<String, Integer>> limited = new ArrayList<>(limits.maxFieldBytes().entrySet());
        limitedFields = limited.stream().mapToInt(e -> schema.require(e.getKey())).toArray();
        limitedBytes = limited.stream().mapToInt(Map.Entry::getValue).toArray();
    }

    String name(int field) {
        return schema.fields().get(field).name;
    }

    /** The request in {@code value}, judged at wall-clock time {@code nowMs}. */
    Result parse(byte[] value, long nowMs) {
        if (value.length == 0) {
            return reject("empty record");
        }
        if (value.length > limits.maxRecordBytes()) {
            return reject("record of " + value.length + " bytes is over the limit of " + limits.maxRecordBytes()
                    + " bytes (dedup.max_record_bytes)");
        }
        Object[] f;
        try {
            f = (Object[]) AvroReader.read(schema, value);
        } catch (AvroReader.MalformedException e) {
            return reject("undecodable NotificationRequest: " + e.getMessage());
        }
        for (int i : requiredText) {
            if (f[i] == null || ((String) f[i]).isEmpty()) {
                return reject(name(i) + " is missing or empty");
            }
        }
        for (int i : nonEmpty) {
            if (f[i] == null || ((List<?>) f[i]).isEmpty()) {
                return reject(name(i) + " is missing or empty");
            }
        }
        for (int k = 0; k < limitedFields.length; k++) {
            Object v = f[limitedFields[k]];
            if (v == null || 3 * ((String) v).length() <= limitedBytes[k]) {
                continue; // a char is at most 3 UTF-8 bytes (a surrogate pair: 4 for 2 chars)
            }
            int bytes = utf8Length((String) v);
            if (bytes > limitedBytes[k]) {
                return reject(name(limitedFields[k]) + " of " + bytes + " bytes is over the limit of " + limitedBytes[k]
                        + " bytes (dedup.max_field_bytes)");
            }
        }
        String tooBig = checkParams((Map<?, ?>) f[params]);
        if (tooBig != null) {
            return reject(tooBig);
        }
        long t = (Long) f[eventTime];
        if (t > nowMs + limits.maxFutureMs()) {
            return reject(name(eventTime) + " " + t + " is " + (t - nowMs) + " ms ahead of the clock, more than the "
                    + limits.maxFutureMs() + " ms allowed (dedup.max_future_ms)");
        }
        f[channels] = new ArrayList<>(new LinkedHashSet<>((List<?>) f[channels]));
        return new Result(f, null);
    }

    private String checkParams(Map<?, ?> map) {
        if (map.size() > limits.maxParams()) {
            return "params has " + map.size() + " entries, more than the limit of " + limits.maxParams()
                    + " (dedup.max_params)";
        }
        for (Map.Entry<?, ?> e : map.entrySet()) {
            String k = (String) e.getKey();
            String v = (String) e.getValue();
            if (3 * Math.max(k.length(), v.length()) <= limits.maxParamBytes()) {
                continue; // a char is at most 3 UTF-8 bytes (a surrogate pair: 4 for 2 chars)
            }
            int bytes = Math.max(utf8Length(k), utf8Length(v));
            if (bytes > limits.maxParamBytes()) {
                return "a params entry of " + bytes + " bytes is over the limit of " + limits.maxParamBytes()
                        + " bytes (dedup.max_param_bytes)";
            }
        }
        return null;
    }

    private static Result reject(String reason) {
        return new Result(null, reason);
    }

    /** UTF-8 length of a string, without encoding it. */
    static int utf8Length(String s) {
        int n = 0;
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c < 0x80) {
                n += 1;
            } else if (c < 0x800) {
                n += 2;
            } else if (Character.isHighSurrogate(c) && i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1))) {
                n += 4;
                i++;
            } else {
                n += 3;
            }
        }
        return n;
    }

    static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }
}
