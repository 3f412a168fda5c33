package io.notifydedup.flink;

import org.apache.flink.api.common.eventtime.SerializableTimestampAssigner;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.types.Row;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.time.Duration;

/**
 * Reads {@code event_time} out of a schemaless Avro {@code NotificationRequest} inside the Kafka
 * source, so that watermarks are generated per Kafka partition (per split) with idleness.
 *
 * <p>The walk follows schemas/notification_request.avsc field by field and checks the structure
 * (lengths, UTF-8, enum ranges, union branches, no trailing bytes). A record that does not have that
 * shape gets {@link Long#MIN_VALUE}, so undecodable input can never move the watermark; the
 * Python decoder then routes it to the invalid topic.
 */
public final class EventTimeAssigner implements SerializableTimestampAssigner<Row> {
    private static final long serialVersionUID = 1L;
    private static final int VALUE_FIELD = 3;
    private static final int CHANNELS = 3;
    private static final int PRIORITIES = 3;
    private static final int CATEGORIES = 2;

    private final long maxFutureMs;

    public EventTimeAssigner(long maxFutureMs) {
        this.maxFutureMs = maxFutureMs;
    }

    /**
     * Bounded out-of-orderness per partition, idle partitions ignored after {@code idleMs};
     * event times more than {@code maxFutureMs} ahead of the wall clock are ignored (the Python
     * side rejects those records as invalid).
     */
    public static WatermarkStrategy<Row> strategy(long outOfOrdernessMs, long idleMs, long maxFutureMs) {
        WatermarkStrategy<Row> strategy =
                WatermarkStrategy.<Row>forBoundedOutOfOrderness(Duration.ofMillis(outOfOrdernessMs))
                        .withTimestampAssigner(new EventTimeAssigner(maxFutureMs));
        return idleMs > 0 ? strategy.withIdleness(Duration.ofMillis(idleMs)) : strategy;
    }

    @Override
    public long extractTimestamp(Row row, long recordTimestamp) {
        byte[] value = (byte[]) row.getField(VALUE_FIELD);
        long eventTime = value == null ? Long.MIN_VALUE : eventTime(value);
        return eventTime > System.currentTimeMillis() + maxFutureMs ? Long.MIN_VALUE : eventTime;
    }

    /** The request's event_time, or Long.MIN_VALUE when the bytes are not a NotificationRequest. */
    public static long eventTime(byte[] buf) {
        try {
            Reader r = new Reader(buf);
            // notification_id, user_id, template_id: required and non-empty
            if (r.string() == 0 || r.string() == 0 || r.string() == 0) {
                return Long.MIN_VALUE;
            }
            for (long n = r.blockCount(); n != 0; n = r.blockCount()) { // params
                for (long i = 0; i < n; i++) {
                    r.string();
                    r.string();
                }
            }
            long channels = 0;
            for (long n = r.blockCount(); n != 0; n = r.blockCount()) {
                for (long i = 0; i < n; i++, channels++) {
                    r.enumIndex(CHANNELS);
                }
            }
            if (channels == 0) {
                return Long.MIN_VALUE;
            }
            r.enumIndex(PRIORITIES);
            r.enumIndex(CATEGORIES);
            long eventTime = r.varLong();
            if (r.enumIndex(2) == 1) { // dedup_key: [null, string]
                r.string();
            }
            if (r.enumIndex(2) == 1) { // dedup_ttl_sec: [null, long]
                r.varLong();
            }
            return r.atEnd() ? eventTime : Long.MIN_VALUE;
        } catch (IllegalStateException | ArrayIndexOutOfBoundsException e) {
            return Long.MIN_VALUE;
        }
    }

    private static final ThreadLocal<CharsetDecoder> UTF8 =
            ThreadLocal.withInitial(
                    () ->
                            StandardCharsets.UTF_8
                                    .newDecoder()
                                    .onMalformedInput(CodingErrorAction.REPORT)
                                    .onUnmappableCharacter(CodingErrorAction.REPORT));

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

        /** Skips a string, checking it is valid UTF-8 as the Python decoder does. */
        long string() {
            long len = varLong();
            if (len < 0 || len > buf.length - pos) {
                throw new IllegalStateException("bad length");
            }
            try {
                UTF8.get().decode(ByteBuffer.wrap(buf, pos, (int) len));
            } catch (CharacterCodingException e) {
                throw new IllegalStateException("not UTF-8");
            }
            pos += (int) len;
            return len;
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
