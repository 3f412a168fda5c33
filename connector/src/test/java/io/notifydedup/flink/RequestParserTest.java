package io.notifydedup.flink;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;

import io.notifydedup.contract.AvroSchema;
import io.notifydedup.contract.AvroWriter;
import io.notifydedup.contract.Contract;

import org.junit.jupiter.api.Test;

import java.util.HashMap;
import java.util.List;
import java.util.Map;

/** What makes a request unusable, and the reason each gives (it names the limit). */
class RequestParserTest {
    private final Contract contract = Contract.packaged();
    private final RequestParser parser = new RequestParser(contract, Fixtures.limits());
    private final AvroSchema schema = contract.request();

    private Object[] fields() {
        Object[] f = new Object[schema.fields().size()];
        f[schema.require("notification_id")] = "n-1";
        f[schema.require("user_id")] = "u-1";
        f[schema.require("template_id")] = "otp";
        f[schema.require("params")] = Map.of("code", "1234");
        f[schema.require("channels")] = List.of(1, 1, 0, 1);
        f[schema.require("priority")] = 0;
        f[schema.require("category")] = 0;
        f[schema.require("event_time")] = Fixtures.NOW;
        f[schema.require("dedup_key")] = null;
        f[schema.require("dedup_ttl_sec")] = 300L;
        return f;
    }

    private String reason(Object[] f) {
        return parser.parse(AvroWriter.write(schema, f), Fixtures.NOW).reason;
    }

    @Test
    void aValidRequestIsNormalized() {
        RequestParser.Result r = parser.parse(AvroWriter.write(schema, fields()), Fixtures.NOW);
        assertNull(r.reason);
        assertNotNull(r.fields);
        assertEquals(List.of(1, 0), r.fields[parser.channels]);
    }

    @Test
    void requiredFieldsAndChannels() {
        Object[] f = fields();
        f[schema.require("user_id")] = "";
        assertEquals("user_id is missing or empty", reason(f));
        f = fields();
        f[schema.require("channels")] = List.of();
        assertEquals("channels is missing or empty", reason(f));
        assertEquals("empty record", parser.parse(new byte[0], Fixtures.NOW).reason);
    }

    @Test
    void limitsAreNamedInTheReason() {
        Object[] f = fields();
        f[schema.require("dedup_key")] = "k".repeat(513);
        assertEquals("dedup_key of 513 bytes is over the limit of 512 bytes (dedup.max_field_bytes)", reason(f));
        f = fields();
        f[schema.require("notification_id")] = "ü".repeat(300);
        assertEquals("notification_id of 600 bytes is over the limit of 512 bytes (dedup.max_field_bytes)", reason(f));
        f = fields();
        Map<String, String> many = new HashMap<>();
        for (int i = 0; i < 65; i++) {
            many.put("p" + i, "v");
        }
        f[schema.require("params")] = many;
        assertEquals("params has 65 entries, more than the limit of 64 (dedup.max_params)", reason(f));
        f = fields();
        f[schema.require("params")] = Map.of("big", "x".repeat(4097));
        assertEquals("a params entry of 4097 bytes is over the limit of 4096 bytes (dedup.max_param_bytes)", reason(f));
        byte[] huge = new byte[64 * 1024 + 1];
        assertEquals("record of 65537 bytes is over the limit of 65536 bytes (dedup.max_record_bytes)",
                parser.parse(huge, Fixtures.NOW).reason);
    }

    @Test
    void anEventTimeFromTheFutureIsInvalid() {
        Object[] f = fields();
        f[schema.require("event_time")] = Fixtures.NOW + 300_000L;
        assertNull(reason(f));
        f[schema.require("event_time")] = Fixtures.NOW + 86_400_000L;
        assertEquals("event_time " + (Fixtures.NOW + 86_400_000L) + " is 86400000 ms ahead of the clock, more than the"
                + " 300000 ms allowed (dedup.max_future_ms)", reason(f));
    }

    @Test
    void utf8Length() {
        assertEquals(0, RequestParser.utf8Length(""));
        assertEquals(1 + 2 + 3 + 4, RequestParser.utf8Length("aé日😀"));
    }
}
