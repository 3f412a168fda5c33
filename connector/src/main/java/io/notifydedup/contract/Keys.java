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
        MessageDigest sha = "SHA-256".equals(digest) ? SHA256.get() : newDigest(digest);
        Canonical.digestJson(sha, userId + separator + templateId + separator, params);
        byte[] d = sha.digest();
        char[] out = new char[hexChars];
        for (int i = 0; i < hexChars; i++) {
            int b = d[i / 2];
            out[i] = HEX[(i % 2 == 0 ? b >> 4 : b) & 0xf];
        }
        return new String(out);
    }

    private static MessageDigest newDigest(String name) {
        try {
            return MessageDigest.getInstance(name);
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(name + " is not available", e);
        }
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

    private static final ThreadLocal<MessageDigest> SHA256 = ThreadLocal.withInitial(() -> {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("SHA-256 is not available", e);
        }
    });

    /**
     * The dedup key's 64-bit hash: the first 8 bytes of its SHA-256 (UTF-8), big-endian. Stable
     * across runs, builds and languages (operators/dedup_key.py key_hash): the Bloom prefilter's
     * item, computed here so that Python does not hash on its hot path.
     */
    public static long keyHash(String key) {
        byte[] d = SHA256.get().digest(key.getBytes(StandardCharsets.UTF_8));
        long h = 0;
        for (int i = 0; i < 8; i++) {
            h = (h << 8) | (d[i] & 0xff);
        }
        return h;
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
