package io.notifydedup.contract;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.Map;

/**
 * The keys the contract defines: a request's dedup key, a channel message's message key, and the
 * shard of the keyed state a dedup key lives in. operators/dedup_key.py is the Python twin; both
 * are checked against tests/vectors.json.
 */
public final class Keys {
    private static final char[] HEX = "0123456789abcdef".toCharArray();

    private final String separator;
    private final String digest;
    private final int hexChars;
    private final String messageKeySeparator;

    public Keys(Contract contract) {
        if (!contract.derivedFrom.equals(java.util.List.of("user_id", "template_id", "params"))) {
            throw new IllegalArgumentException("the derived dedup key is made of user_id, template_id and params");
        }
        separator = contract.keySeparator;
        digest = contract.keyDigest;
        hexChars = contract.keyHexChars;
        messageKeySeparator = contract.messageKeySeparator;
    }

    /**
     * {@code explicit} when given and non-empty, else the first hex characters of
     * {@code digest(user_id | template_id | canonical_json(params))}.
     */
    public String dedupKey(String explicit, String userId, String templateId, Map<String, ?> params) {
        if (explicit != null && !explicit.isEmpty()) {
            return explicit;
        }
        MessageDigest sha;
        try {
            sha = MessageDigest.getInstance(digest);
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(digest + " is not available", e);
        }
        String text = userId + separator + templateId + separator + Canonical.json(params);
        byte[] d = sha.digest(text.getBytes(StandardCharsets.UTF_8));
        char[] out = new char[hexChars];
        for (int i = 0; i < hexChars; i++) {
            int b = d[i / 2];
            out[i] = HEX[(i % 2 == 0 ? b >> 4 : b) & 0xf];
        }
        return new String(out);
    }

    /** The message key: the contract's parts, in order, joined by its separator. */
    public String messageKey(Object... parts) {
        StringBuilder sb = new StringBuilder();
        for (int i = 0; i < parts.length; i++) {
            if (i > 0) {
                sb.append(messageKeySeparator);
            }
            sb.append(parts[i]);
        }
        return sb.toString();
    }

    /** Stable, well spread: the same key is in the same shard in every run and build. */
    public static int shardOf(String key, int shards) {
        int h = key.hashCode();
        h ^= h >>> 16;
        h *= 0x85ebca6b;
        h ^= h >>> 13;
        h *= 0xc2b2ae35;
        h ^= h >>> 16;
        return Math.floorMod(h, shards);
    }
}
