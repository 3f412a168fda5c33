package io.notifydedup.contract;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Reads schemaless Avro binary by walking an {@link AvroSchema}, strictly and in time linear in
 * the input: a varint longer than its type allows, a length or count beyond the bytes left, bad
 * UTF-8, an enum or union index out of range and trailing bytes are rejected at once, with the
 * field they were found in.
 *
 * <p>Values: a record is an {@code Object[]} in field order, a string a {@code String}, bytes a
 * {@code byte[]}, an int an {@code Integer}, a long a {@code Long}, an enum its symbol's index
 * ({@code Integer}), an array a {@code List}, a map a {@code LinkedHashMap} (a repeated key keeps
 * its last value), a union the value of its branch ({@code null} for the null branch).
 */
public final class AvroReader {
    private static final int MAX_LONG_BYTES = 10;
    private static final int MAX_INT_BYTES = 5;

    private static final ThreadLocal<CharsetDecoder> UTF8 =
            ThreadLocal.withInitial(
                    () ->
                            StandardCharsets.UTF_8
                                    .newDecoder()
                                    .onMalformedInput(CodingErrorAction.REPORT)
                                    .onUnmappableCharacter(CodingErrorAction.REPORT));

    /** The bytes are not a value of the schema; the message says what and where. */
    public static final class MalformedException extends Exception {
        private static final long serialVersionUID = 1L;

        MalformedException(String message) {
            super(message, null, false, false);
        }
    }

    private final byte[] buf;
    private int pos;
    private String path = "";

    private AvroReader(byte[] buf) {
        this.buf = buf;
    }

    /**
     * One whole value of {@code schema}: nothing may be left over. A record may end where its
     * trailing optional fields (unions whose first branch is null, so their default is null) begin:
     * it was written before they were added, and they read as null.
     */
    public static Object read(AvroSchema schema, byte[] bytes) throws MalformedException {
        AvroReader r = new AvroReader(bytes);
        Object value = schema.kind == AvroSchema.Kind.RECORD ? r.record(schema) : r.value(schema);
        if (r.pos != bytes.length) {
            throw new MalformedException((bytes.length - r.pos) + " trailing bytes after the record");
        }
        return value;
    }

    private Object[] record(AvroSchema s) throws MalformedException {
        Object[] out = new Object[s.fields().size()];
        for (AvroSchema.Field f : s.fields()) {
            if (pos == buf.length && optionalFrom(s, f.pos)) {
                return out;
            }
            path = f.name;
            out[f.pos] = value(f.schema);
        }
        path = "";
        return out;
    }

    /** Whether every field from {@code first} on is a union whose first branch is null. */
    static boolean optionalFrom(AvroSchema s, int first) {
        List<AvroSchema.Field> fields = s.fields();
        for (int i = first; i < fields.size(); i++) {
            AvroSchema t = fields.get(i).schema;
            if (t.kind != AvroSchema.Kind.UNION || t.branches().get(0).kind != AvroSchema.Kind.NULL) {
                return false;
            }
        }
        return true;
    }

    private MalformedException malformed(String what) {
        String where = path.isEmpty() ? "" : " in field " + path;
        return new MalformedException(what + where + " at byte " + pos);
    }

    private Object value(AvroSchema s) throws MalformedException {
        switch (s.kind) {
            case NULL:
                return null;
            case BOOLEAN: {
                int b = next();
                if (b > 1) {
                    throw malformed("boolean byte " + b);
                }
                return b == 1;
            }
            case INT: {
                long v = varint(MAX_INT_BYTES);
                if (v < Integer.MIN_VALUE || v > Integer.MAX_VALUE) {
                    throw malformed("int out of range");
                }
                return (int) v;
            }
            case LONG:
                return varint(MAX_LONG_BYTES);
            case FLOAT:
                return Float.intBitsToFloat((int) fixed(4));
            case DOUBLE:
                return Double.longBitsToDouble(fixed(8));
            case BYTES: {
                int len = length("bytes");
                byte[] out = new byte[len];
                System.arraycopy(buf, pos, out, 0, len);
                pos += len;
                return out;
            }
            case STRING:
                return string();
            case RECORD: {
                Object[] out = new Object[s.fields().size()];
                String outer = path;
                for (AvroSchema.Field f : s.fields()) {
                    path = outer.isEmpty() ? f.name : outer + "." + f.name;
                    out[f.pos] = value(f.schema);
                }
                path = outer;
                return out;
            }
            case ENUM:
                return index(s.symbols().size(), "enum " + s.name);
            case UNION:
                return value(s.branches().get(index(s.branches().size(), "union")));
            case ARRAY: {
                List<Object> out = new ArrayList<>();
                for (long n = blockCount(); n != 0; n = blockCount()) {
                    for (long i = 0; i < n; i++) {
                        out.add(value(s.element));
                    }
                }
                return out;
            }
            case MAP: {
                Map<String, Object> out = new LinkedHashMap<>();
                for (long n = blockCount(); n != 0; n = blockCount()) {
                    for (long i = 0; i < n; i++) {
                        String key = string();
                        out.put(key, value(s.element));
                    }
                }
                return out;
            }
            default:
                throw new IllegalStateException("unhandled Avro kind " + s.kind);
        }
    }

    private int next() throws MalformedException {
        if (pos >= buf.length) {
            throw malformed("unexpected end of the record");
        }
        return buf[pos++] & 0xff;
    }

    /** A zig-zag varint of at most {@code maxBytes} bytes. */
    private long varint(int maxBytes) throws MalformedException {
        long raw = 0;
        for (int i = 0; i < maxBytes; i++) {
            int b = next();
            raw |= (long) (b & 0x7f) << (7 * i);
            if ((b & 0x80) == 0) {
                return (raw >>> 1) ^ -(raw & 1);
            }
        }
        throw malformed("varint longer than " + maxBytes + " bytes");
    }

    private long fixed(int n) throws MalformedException {
        if (buf.length - pos < n) {
            throw malformed("unexpected end of the record");
        }
        long v = 0;
        for (int i = 0; i < n; i++) {
            v |= (long) (buf[pos++] & 0xff) << (8 * i);
        }
        return v;
    }

    private int length(String what) throws MalformedException {
        long len = varint(MAX_LONG_BYTES);
        if (len < 0 || len > buf.length - pos) {
            throw malformed(what + " length " + len + " exceeds the " + (buf.length - pos) + " bytes left");
        }
        return (int) len;
    }

    private String string() throws MalformedException {
        int len = length("string");
        try {
            String s = UTF8.get().decode(ByteBuffer.wrap(buf, pos, len)).toString();
            pos += len;
            return s;
        } catch (CharacterCodingException e) {
            throw malformed("invalid UTF-8");
        }
    }

    private int index(int size, String what) throws MalformedException {
        long i = varint(MAX_LONG_BYTES);
        if (i < 0 || i >= size) {
            throw malformed(what + " index " + i + " out of range [0, " + size + ")");
        }
        return (int) i;
    }

    /** The item count of the next block (0 ends the array or map); every item takes a byte at least. */
    private long blockCount() throws MalformedException {
        long n = varint(MAX_LONG_BYTES);
        if (n < 0) {
            n = -n;
            varint(MAX_LONG_BYTES); // the block's size in bytes
        }
        if (n < 0 || n > buf.length - pos) {
            throw malformed("block of " + n + " items exceeds the " + (buf.length - pos) + " bytes left");
        }
        return n;
    }
}
