package io.notifydedup.contract;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.List;
import java.util.Map;

/**
 * Writes schemaless Avro binary by walking an {@link AvroSchema}; values as {@link AvroReader}
 * returns them. Maps are written in one block, in key order (code points), so that an encoding does
 * not depend on the order a map happened to be built in; arrays in one block.
 */
public final class AvroWriter {
    private byte[] buf;
    private int len;

    public AvroWriter(int capacity) {
        buf = new byte[Math.max(16, capacity)];
    }

    /** {@code value} as a value of {@code schema}. */
    public static byte[] write(AvroSchema schema, Object value) {
        AvroWriter w = new AvroWriter(128);
        w.value(schema, value);
        return w.bytes();
    }

    public byte[] bytes() {
        return Arrays.copyOf(buf, len);
    }

    public void value(AvroSchema s, Object v) {
        switch (s.kind) {
            case NULL:
                return;
            case BOOLEAN:
                ensure(1);
                buf[len++] = (byte) (((Boolean) v) ? 1 : 0);
                return;
            case INT:
            case ENUM:
                varLong(((Number) v).longValue());
                return;
            case LONG:
                varLong((Long) v);
                return;
            case FLOAT:
                fixed(Float.floatToIntBits((Float) v), 4);
                return;
            case DOUBLE:
                fixed(Double.doubleToLongBits((Double) v), 8);
                return;
            case BYTES:
                bytes((byte[]) v);
                return;
            case STRING:
                string((String) v);
                return;
            case RECORD: {
                Object[] fields = (Object[]) v;
                for (AvroSchema.Field f : s.fields()) {
                    value(f.schema, fields[f.pos]);
                }
                return;
            }
            case UNION: {
                int nullBranch = s.nullBranch();
                if (v == null) {
                    if (nullBranch < 0) {
                        throw new IllegalArgumentException("null for a union without a null branch");
                    }
                    varLong(nullBranch);
                    return;
                }
                AvroSchema branch = s.nonNullBranch();
                if (branch == null) {
                    throw new IllegalArgumentException("only unions of null and one type are written");
                }
                varLong(s.branches().indexOf(branch));
                value(branch, v);
                return;
            }
            case ARRAY: {
                Collection<?> items = (Collection<?>) v;
                if (!items.isEmpty()) {
                    varLong(items.size());
                    for (Object item : items) {
                        value(s.element, item);
                    }
                }
                varLong(0);
                return;
            }
            case MAP: {
                Map<?, ?> map = (Map<?, ?>) v;
                if (!map.isEmpty()) {
                    List<String> keys = new ArrayList<>();
                    for (Object k : map.keySet()) {
                        keys.add((String) k);
                    }
                    keys.sort(Canonical::compareCodePoints);
                    varLong(keys.size());
                    for (String k : keys) {
                        string(k);
                        value(s.element, map.get(k));
                    }
                }
                varLong(0);
                return;
            }
            default:
                throw new IllegalStateException("unhandled Avro kind " + s.kind);
        }
    }

    public void varLong(long value) {
        ensure(10);
        long n = (value << 1) ^ (value >> 63);
        while ((n & ~0x7FL) != 0) {
            buf[len++] = (byte) ((n & 0x7F) | 0x80);
            n >>>= 7;
        }
        buf[len++] = (byte) n;
    }

    public void string(String s) {
        bytes(s.getBytes(StandardCharsets.UTF_8));
    }

    public void bytes(byte[] b) {
        varLong(b.length);
        ensure(b.length);
        System.arraycopy(b, 0, buf, len, b.length);
        len += b.length;
    }

    private void fixed(long bits, int n) {
        ensure(n);
        for (int i = 0; i < n; i++) {
            buf[len++] = (byte) (bits >>> (8 * i));
        }
    }

    private void ensure(int more) {
        if (len + more > buf.length) {
            buf = Arrays.copyOf(buf, Math.max(buf.length * 2, len + more));
        }
    }
}
