package io.notifydedup.contract;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Random;

/** The generic reader and writer on the contract's own schemas: strict, linear, and each other's inverse. */
class AvroReaderTest {
    private final Contract contract = Contract.packaged();
    private final AvroSchema request = contract.request();

    private byte[] valid() {
        return valid(null);
    }

    private byte[] valid(String traceparent) {
        Object[] f = new Object[request.fields().size()];
        f[request.require("notification_id")] = "n-1";
        f[request.require("user_id")] = "ü-1";
        f[request.require("template_id")] = "otp";
        f[request.require("params")] = Map.of("code", "1234", "😀", "𝄞");
        f[request.require("channels")] = List.of(1, 0);
        f[request.require("priority")] = 0;
        f[request.require("category")] = 1;
        f[request.require("event_time")] = 1_796_115_600_000L;
        f[request.require("dedup_key")] = "k";
        f[request.require("dedup_ttl_sec")] = null;
        f[request.require("traceparent")] = traceparent;
        return AvroWriter.write(request, f);
    }

    /** A request of the schema before traceparent: the same bytes without the field's last union branch and string. */
    @Test
    void aRecordWrittenBeforeItsTrailingOptionalFieldsReadsThemAsNull() throws Exception {
        Object[] f = (Object[]) AvroReader.read(request, valid("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"));
        int tp = request.require("traceparent");
        assertEquals("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", f[tp]);
        f[tp] = null;
        byte[] withNull = AvroWriter.write(request, f);
        byte[] old = Arrays.copyOf(withNull, withNull.length - 1); // the null branch's index is one byte
        Object[] back = (Object[]) AvroReader.read(request, old);
        assertEquals(null, back[tp]);
        assertEquals("n-1", back[request.require("notification_id")]);
        // a record cut inside a required field is still malformed
        byte[] cut = Arrays.copyOf(withNull, 5);
        assertThrows(AvroReader.MalformedException.class, () -> AvroReader.read(request, cut));
    }

    @Test
    void roundTrip() throws Exception {
        byte[] raw = valid();
        Object[] f = (Object[]) AvroReader.read(request, raw);
        assertEquals("ü-1", f[request.require("user_id")]);
        assertEquals(List.of(1, 0), f[request.require("channels")]);
        assertEquals(Map.of("code", "1234", "😀", "𝄞"), f[request.require("params")]);
        assertArrayEquals(raw, AvroWriter.write(request, f));
    }

    @Test
    void aVarintLongerThanTenBytesIsRejectedAtOnce() {
        byte[] raw = new byte[1_000_000];
        Arrays.fill(raw, (byte) 0x80);
        long start = System.nanoTime();
        AvroReader.MalformedException e = assertThrows(AvroReader.MalformedException.class, () -> AvroReader.read(request, raw));
        assertTrue(e.getMessage().startsWith("varint longer than 10 bytes in field notification_id"), e.getMessage());
        assertTrue(System.nanoTime() - start < 50_000_000L, "rejected within 50 ms");
    }

    @Test
    void lengthsBeyondTheRecordAreRejected() {
        byte[] raw = {(byte) 0xfe, (byte) 0xff, (byte) 0xff, (byte) 0xff, 0x0f, 'a'};
        AvroReader.MalformedException e = assertThrows(AvroReader.MalformedException.class, () -> AvroReader.read(request, raw));
        assertTrue(e.getMessage().contains("string length 2147483647 exceeds the 1 bytes left"), e.getMessage());
    }

    @Test
    void badUtf8EnumAndUnionIndexesAndTrailingBytesAreRejected() {
        byte[] good = valid();
        byte[] utf8 = good.clone();
        utf8[1] = (byte) 0xff; // inside "n-1"
        assertThrows(AvroReader.MalformedException.class, () -> AvroReader.read(request, utf8));
        byte[] trailing = Arrays.copyOf(good, good.length + 1);
        AvroReader.MalformedException e = assertThrows(AvroReader.MalformedException.class, () -> AvroReader.read(request, trailing));
        assertEquals("1 trailing bytes after the record", e.getMessage());
        byte[] union = good.clone();
        union[union.length - 2] = 0x04; // dedup_ttl_sec branch 2 of [null, long] (traceparent's null last)
        e = assertThrows(AvroReader.MalformedException.class, () -> AvroReader.read(request, union));
        assertTrue(e.getMessage().contains("union index 2 out of range [0, 2) in field dedup_ttl_sec"), e.getMessage());
    }

    @Test
    void garbageNeverThrowsAnythingElse() {
        Random rng = new Random(7);
        byte[] good = valid();
        for (int i = 0; i < 200_000; i++) {
            byte[] raw = rng.nextBoolean() ? new byte[rng.nextInt(80)] : good.clone();
            if (raw.length != good.length || rng.nextBoolean()) {
                rng.nextBytes(raw);
            } else {
                raw[rng.nextInt(raw.length)] ^= (byte) (1 << rng.nextInt(8));
            }
            try {
                AvroReader.read(request, raw);
            } catch (AvroReader.MalformedException expected) {
                // the only way to fail
            }
        }
    }
}
