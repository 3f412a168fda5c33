package io.notifydedup.flink;

import java.util.Map;

/** Limits and a clock for the connector's tests: the settings' defaults. */
final class Fixtures {
    /** 2027-01-01T00:00:00Z: after every event time of the vectors. */
    static final long NOW = 1_798_761_600_000L;

    private Fixtures() {}

    static Limits limits() {
        return new Limits(64 * 1024,
                Map.of("dedup_key", 512, "notification_id", 512, "user_id", 512, "template_id", 512),
                64, 4096, 300_000L, 4096);
    }
}
