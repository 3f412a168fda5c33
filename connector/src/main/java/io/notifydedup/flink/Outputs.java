package io.notifydedup.flink;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Map;

/**
 * Schemaless Avro encoders of the records the job writes, field by field as schemas/*.avsc
 * define them, from a request parsed by {@link RequestParser}. A request is written normalized,
 * as the Python codec writes it: each channel once, a map in one block.
 */
final class Outputs {
    private Outputs() {}

    static final String[] CHANNELS = {"push", "sms", "email"};
    static final int PRIORITY_HIGH = 0;

    /** ChannelMessage: the accepted request on one channel, with its message and dedup keys. */
    static byte[] channelMessage(RequestParser.Fields f, String dedupKey, int channel) {
        Writer w = new Writer(64 + 2 * dedupKey.length());
        w.string(dedupKey + ":" + CHANNELS[channel]);
        w.varLong(channel);
        requestFields(w, f);
        w.string(dedupKey);
        optionalLong(w, f.dedupTtlSec);
        return w.bytes();
    }

    /** DuplicateNotice: a repeat of an accepted request, suppressed. */
    static byte[] duplicateNotice(
            RequestParser.Fields f, String dedupKey, String originalId, long firstSeen, int occurrence) {
        Writer w = new Writer(64 + dedupKey.length());
        w.string(f.notificationId).string(dedupKey).string(originalId);
        w.varLong(firstSeen).varLong(f.eventTime).varLong(occurrence);
        return w.bytes();
    }

    /** LateNotice: the request, the watermark it was behind, and why it is late. */
    static byte[] lateNotice(RequestParser.Fields f, long watermark, String reason) {
        Writer w = new Writer(128);
        request(w, f);
        w.varLong(watermark).string(reason);
        return w.bytes();
    }

    /** NotificationRequest, normalized. */
    static void request(Writer w, RequestParser.Fields f) {
        requestFields(w, f);
        if (f.dedupKey == null) {
            w.varLong(0);
        } else {
            w.varLong(1).string(f.dedupKey);
        }
        optionalLong(w, f.dedupTtlSec);
    }

    /** notification_id to event_time: the fields a ChannelMessage shares with its request. */
    private static void requestFields(Writer w, RequestParser.Fields f) {
        w.string(f.notificationId).string(f.userId).string(f.templateId);
        params(w, f.params);
        channels(w, f.channels);
        w.varLong(f.priority).varLong(f.category).varLong(f.eventTime);
    }

    private static void params(Writer w, Map<String, String> params) {
        if (!params.isEmpty()) {
            w.varLong(params.size());
            for (Map.Entry<String, String> e : params.entrySet()) {
                w.string(e.getKey()).string(e.getValue());
            }
        }
        w.varLong(0);
    }

    private static void channels(Writer w, int[] channels) {
        w.varLong(channels.length);
        for (int c : channels) {
            w.varLong(c);
        }
        w.varLong(0);
    }

    private static void optionalLong(Writer w, Long value) {
        if (value == null) {
            w.varLong(0);
        } else {
            w.varLong(1).varLong(value);
        }
    }

    /** A growing byte buffer with Avro's zig-zag varints and length-prefixed UTF-8. */
    static final class Writer {
        private byte[] buf;
        private int len;

        Writer(int capacity) {
            buf = new byte[capacity];
        }

        Writer varLong(long value) {
            ensure(10);
            long n = (value << 1) ^ (value >> 63);
            while ((n & ~0x7FL) != 0) {
                buf[len++] = (byte) ((n & 0x7F) | 0x80);
                n >>>= 7;
            }
            buf[len++] = (byte) n;
            return this;
        }

        Writer string(String s) {
            byte[] utf8 = s.getBytes(StandardCharsets.UTF_8);
            varLong(utf8.length);
            ensure(utf8.length);
            System.arraycopy(utf8, 0, buf, len, utf8.length);
            len += utf8.length;
            return this;
        }

        byte[] bytes() {
            return Arrays.copyOf(buf, len);
        }

        private void ensure(int more) {
            if (len + more > buf.length) {
                buf = Arrays.copyOf(buf, Math.max(buf.length * 2, len + more));
            }
        }
    }
}
