package io.notifydedup.flink;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * Reads a schemaless Avro {@code NotificationRequest}: its event time (for watermarks), its dedup
 * key (for routing to a shard), what the Python decision needs, and what the output records
 * repeat (see {@link Outputs}).
 *
 * <p>It follows schemas/notification_request.avsc field by field and checks the structure as
 * strictly as the Python decoder does (lengths, UTF-8, enum ranges, union branches, non-empty
 * required fields, no trailing bytes); anything else is {@code null}, and Python reports why.
 */
final class RequestParser {
    private static final int CHANNELS = 3;
    private static final int PRIORITIES = 3;
    private static final int CATEGORIES = 2;

    private static final ThreadLocal<CharsetDecoder> UTF8 =
            ThreadLocal.withInitial(
                    () ->
                            StandardCharsets.UTF_8
                                    .newDecoder()
                                    .onMalformedInput(CodingErrorAction.REPORT)
                                    .onUnmappableCharacter(CodingErrorAction.REPORT));

    /** The fields of a structurally valid request. */
    static final class Fields {
        String notificationId;
        String userId;
        String templateId;
        Map<String, String> params;
        int[] channels; // enum indexes, each once, in first-seen order
        int priority;
        int category;
        long eventTime;
        String dedupKey; // null or empty when not given
        Long dedupTtlSec; // null when not given
    }

    private RequestParser() {}

    /** The request's fields, or null when the bytes are not a NotificationRequest. */
    static Fields parse(byte[] buf) {
        try {
            Reader r = new Reader(buf);
            Fields f = new Fields();
            f.notificationId = r.string();
            f.userId = r.string();
            f.templateId = r.string();
            if (f.notificationId.isEmpty() || f.userId.isEmpty() || f.templateId.isEmpty()) {
                return null;
            }
            f.params = new LinkedHashMap<>();
            for (long n = r.blockCount(); n != 0; n = r.blockCount()) {
                for (long i = 0; i < n; i++) {
                    String key = r.string();
                    f.params.put(key, r.string()); // a repeated key keeps its last value
                }
            }
            int[] seen = new int[CHANNELS];
            int distinct = 0;
            for (long n = r.blockCount(); n != 0; n = r.blockCount()) {
                for (long i = 0; i < n; i++) {
                    int c = (int) r.enumIndex(CHANNELS);
                    boolean known = false;
                    for (int j = 0; j < distinct; j++) {
                        known |= seen[j] == c;
                    }
                    if (!known) {
                        seen[distinct++] = c;
                    }
                }
            }
            if (distinct == 0) {
                return null;
            }
            f.channels = java.util.Arrays.copyOf(seen, distinct);
            f.priority = (int) r.enumIndex(PRIORITIES);
            f.category = (int) r.enumIndex(CATEGORIES);
            f.eventTime = r.varLong();
            f.dedupKey = r.enumIndex(2) == 1 ? r.string() : null;
            f.dedupTtlSec = r.enumIndex(2) == 1 ? r.varLong() : null;
            return r.atEnd() ? f : null;
        } catch (IllegalStateException | ArrayIndexOutOfBoundsException e) {
            return null;
        }
    }

    private static final class Reader {
        private final byte[] buf;
        private int pos;

        Reader(byte[] buf) {
            this.buf = buf;
        }

        long varLong() {
            long raw = 0;
            int shift = 0;
            while (true) {
                if (shift > 63) {
                    throw new IllegalStateException("varint too long");
                }
                byte b = buf[pos++];
                raw |= (long) (b & 0x7f) << shift;
                if ((b & 0x80) == 0) {
                    return (raw >>> 1) ^ -(raw & 1);
                }
                shift += 7;
            }
        }

        String string() {
            long len = varLong();
            if (len < 0 || len > buf.length - pos) {
                throw new IllegalStateException("bad length");
            }
            try {
                String s = UTF8.get().decode(ByteBuffer.wrap(buf, pos, (int) len)).toString();
                pos += (int) len;
                return s;
            } catch (CharacterCodingException e) {
                throw new IllegalStateException("not UTF-8");
            }
        }

        long blockCount() {
            long n = varLong();
            if (n < 0) {
                n = -n;
                varLong(); // block size in bytes
            }
            if (n > buf.length) {
                throw new IllegalStateException("bad block count");
            }
            return n;
        }

        long enumIndex(int size) {
            long i = varLong();
            if (i < 0 || i >= size) {
                throw new IllegalStateException("bad enum or union index");
            }
            return i;
        }

        boolean atEnd() {
            return pos == buf.length;
        }
    }
}
