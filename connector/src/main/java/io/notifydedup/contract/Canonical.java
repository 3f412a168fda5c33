package io.notifydedup.contract;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/**
 * Canonical forms both languages must agree on byte for byte (tests/vectors.json checks them in
 * JUnit and in pytest): the JSON of a request's params and the order of strings.
 */
public final class Canonical {
    private Canonical() {}

    /** Python's {@code json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False)}. */
    public static String json(Map<String, ?> params) {
        List<String> keys = new ArrayList<>(params.keySet());
        keys.sort(Canonical::compareCodePoints);
        StringBuilder sb = new StringBuilder("{");
        for (String k : keys) {
            if (sb.length() > 1) {
                sb.append(',');
            }
            quote(sb, k);
            sb.append(':');
            quote(sb, (String) params.get(k));
        }
        return sb.append('}').toString();
    }

    /** A reusable UTF-8 buffer of one thread. */
    private static final class Buffer {
        byte[] bytes = new byte[512];
        int len;

        void put(int b) {
            if (len == bytes.length) {
                bytes = java.util.Arrays.copyOf(bytes, bytes.length * 2);
            }
            bytes[len++] = (byte) b;
        }

        void ascii(String s) {
            for (int i = 0; i < s.length(); i++) {
                put(s.charAt(i));
            }
        }
    }

    private static final ThreadLocal<Buffer> BUFFER = ThreadLocal.withInitial(Buffer::new);

    /**
     * Feeds {@code prefix} and then the UTF-8 bytes of {@link #json(Map)} to {@code digest},
     * without building the string: the hot path of the dedup key (byte for byte the same).
     */
    public static void digestJson(java.security.MessageDigest digest, String prefix, Map<String, ?> params) {
        Buffer b = BUFFER.get();
        b.len = 0;
        utf8(b, prefix, false);
        List<String> keys = new ArrayList<>(params.keySet());
        if (keys.size() > 1) {
            keys.sort(Canonical::compareCodePoints);
        }
        b.put('{');
        for (int i = 0; i < keys.size(); i++) {
            if (i > 0) {
                b.put(',');
            }
            String k = keys.get(i);
            utf8(b, k, true);
            b.put(':');
            utf8(b, (String) params.get(k), true);
        }
        b.put('}');
        digest.update(b.bytes, 0, b.len);
    }

    /** A string as UTF-8, quoted and escaped as {@link #quote} does when {@code quoted}. */
    private static void utf8(Buffer b, String s, boolean quoted) {
        if (quoted) {
            b.put('"');
        }
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (quoted && (c == '"' || c == '\\' || c < 0x20)) {
                switch (c) {
                    case '"' -> b.ascii("\\\"");
                    case '\\' -> b.ascii("\\\\");
                    case '\n' -> b.ascii("\\n");
                    case '\r' -> b.ascii("\\r");
                    case '\t' -> b.ascii("\\t");
                    case '\b' -> b.ascii("\\b");
                    case '\f' -> b.ascii("\\f");
                    default -> b.ascii(String.format("\\u%04x", (int) c));
                }
            } else if (c < 0x80) {
                b.put(c);
            } else if (c < 0x800) {
                b.put(0xc0 | (c >> 6));
                b.put(0x80 | (c & 0x3f));
            } else if (Character.isHighSurrogate(c) && i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1))) {
                int cp = Character.toCodePoint(c, s.charAt(++i));
                b.put(0xf0 | (cp >> 18));
                b.put(0x80 | ((cp >> 12) & 0x3f));
                b.put(0x80 | ((cp >> 6) & 0x3f));
                b.put(0x80 | (cp & 0x3f));
            } else {
                b.put(0xe0 | (c >> 12));
                b.put(0x80 | ((c >> 6) & 0x3f));
                b.put(0x80 | (c & 0x3f));
            }
        }
        if (quoted) {
            b.put('"');
        }
    }

    /** Python orders str by code point; String.compareTo orders by UTF-16 unit. */
    public static int compareCodePoints(String a, String b) {
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
