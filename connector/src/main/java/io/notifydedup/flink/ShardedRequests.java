package io.notifydedup.flink;

import org.apache.flink.api.common.functions.MapFunction;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.typeutils.ResultTypeQueryable;
import org.apache.flink.types.Row;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * Resolves each request's dedup key and the shard it belongs to, in the JVM, so that the only
 * Python operator on the path is the dedup decision itself.
 *
 * <p>Emits {@code Row(shard, Row(dedup_key, event_time, notification_id, dedup_ttl_sec, topic,
 * partition, offset, value))}, the shape
 * PyFlink's keyed operators take ({@code KeyByKeySelector} keys by field 0). The dedup key is
 * {@code dedup_key} when given and non-empty, else the first 32 hex characters of
 * {@code sha256(user_id + "|" + template_id + "|" + canonical_json(params))}, byte for byte the
 * key operators/dedup_key.py derives. A record that is not a well-formed request gets an empty
 * key and a shard picked from its offset; Python reports it as invalid.
 */
public final class ShardedRequests implements MapFunction<Row, Row>, ResultTypeQueryable<Row> {
    private static final long serialVersionUID = 1L;
    private static final char[] HEX = "0123456789abcdef".toCharArray();
    private static final int DERIVED_KEY_HEX_CHARS = 32;

    private final int shards;

    public ShardedRequests(int shards) {
        this.shards = shards;
    }

    public static TypeInformation<Row> payloadType() {
        return Types.ROW_NAMED(
                new String[] {
                    "dedup_key", "event_time", "notification_id", "dedup_ttl_sec", "topic", "partition", "offset", "value"
                },
                Types.STRING,
                Types.LONG,
                Types.STRING,
                Types.LONG,
                Types.STRING,
                Types.INT,
                Types.LONG,
                Types.PRIMITIVE_ARRAY(Types.BYTE));
    }

    @Override
    public TypeInformation<Row> getProducedType() {
        return Types.ROW(Types.INT, payloadType());
    }

    @Override
    public Row map(Row raw) throws Exception {
        byte[] value = (byte[]) raw.getField(3);
        RequestParser.Fields f = RequestParser.parse(value);
        if (f == null) {
            int shard = (int) Math.floorMod((Long) raw.getField(2), (long) shards);
            return Row.of(shard, Row.of("", 0L, "", null, raw.getField(0), raw.getField(1), raw.getField(2), value));
        }
        String key = dedupKey(f);
        return Row.of(
                shardOf(key, shards),
                Row.of(key, f.eventTime, f.notificationId, f.dedupTtlSec, raw.getField(0), raw.getField(1), raw.getField(2), value));
    }

    static String dedupKey(RequestParser.Fields f) throws NoSuchAlgorithmException {
        if (f.dedupKey != null && !f.dedupKey.isEmpty()) {
            return f.dedupKey;
        }
        MessageDigest sha = MessageDigest.getInstance("SHA-256");
        String text = f.userId + "|" + f.templateId + "|" + canonicalJson(f.params);
        byte[] digest = sha.digest(text.getBytes(StandardCharsets.UTF_8));
        char[] out = new char[DERIVED_KEY_HEX_CHARS];
        for (int i = 0; i < DERIVED_KEY_HEX_CHARS / 2; i++) {
            out[2 * i] = HEX[(digest[i] >> 4) & 0xf];
            out[2 * i + 1] = HEX[digest[i] & 0xf];
        }
        return new String(out);
    }

    /** Stable, well spread: the same key is in the same shard in every run and build. */
    static int shardOf(String key, int shards) {
        int h = key.hashCode();
        h ^= h >>> 16;
        h *= 0x85ebca6b;
        h ^= h >>> 13;
        h *= 0xc2b2ae35;
        h ^= h >>> 16;
        return Math.floorMod(h, shards);
    }

    /** Python's json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False). */
    static String canonicalJson(Map<String, String> params) {
        List<String> keys = new ArrayList<>(params.keySet());
        keys.sort(ShardedRequests::compareCodePoints);
        StringBuilder sb = new StringBuilder("{");
        for (String k : keys) {
            if (sb.length() > 1) {
                sb.append(',');
            }
            quote(sb, k);
            sb.append(':');
            quote(sb, params.get(k));
        }
        return sb.append('}').toString();
    }

    /** Python orders str by code point; String.compareTo orders by UTF-16 unit. */
    static int compareCodePoints(String a, String b) {
        int i = 0;
        int j = 0;
        while (i < a.length() && j < b.length()) {
            int ca = a.codePointAt(i);
            int cb = b.codePointAt(j);
            if (ca != cb) {
                return Integer.compare(ca, cb);
            }
            i += Character.charCount(ca);
            j += Character.charCount(cb);
        }
        return Integer.compare(a.length() - i, b.length() - j);
    }

    private static void quote(StringBuilder sb, String s) {
        sb.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> sb.append("\\\"");
                case '\\' -> sb.append("\\\\");
                case '\n' -> sb.append("\\n");
                case '\r' -> sb.append("\\r");
                case '\t' -> sb.append("\\t");
                case '\b' -> sb.append("\\b");
                case '\f' -> sb.append("\\f");
                default -> {
                    if (c < 0x20) {
                        sb.append(String.format("\\u%04x", (int) c));
                    } else {
                        sb.append(c);
                    }
                }
            }
        }
        sb.append('"');
    }
}
