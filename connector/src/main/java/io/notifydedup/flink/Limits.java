package io.notifydedup.flink;

import java.io.Serializable;
import java.util.Map;

/**
 * What a request may be, beyond its schema (the {@code dedup.*} limits of the settings): a request
 * beyond any of them is invalid, with a reason that names the limit, and never reaches an operator
 * that could fail on it or a sink that could refuse it.
 *
 * @param maxRecordBytes the longest serialized request
 * @param maxFieldBytes the longest value (UTF-8) of each named text field
 * @param maxParams the most entries in params
 * @param maxParamBytes the longest params key or value (UTF-8)
 * @param maxFutureMs how far ahead of the wall clock an event time may be (clock skew)
 * @param invalidRawPrefixBytes how many of a rejected record's bytes its InvalidRecord keeps
 */
public record Limits(
        int maxRecordBytes,
        Map<String, Integer> maxFieldBytes,
        int maxParams,
        int maxParamBytes,
        long maxFutureMs,
        int invalidRawPrefixBytes) implements Serializable {

    public Limits {
        maxFieldBytes = Map.copyOf(maxFieldBytes);
        if (maxRecordBytes < 1 || maxParams < 0 || maxParamBytes < 1 || maxFutureMs < 0 || invalidRawPrefixBytes < 0) {
            throw new IllegalArgumentException("limits must be positive");
        }
    }
}
