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
