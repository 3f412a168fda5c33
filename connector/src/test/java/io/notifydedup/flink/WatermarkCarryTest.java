package io.notifydedup.flink;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Test;

import java.util.List;

class WatermarkCarryTest {
    @Test
    void theLowestOfTheSubtasksIsRestored() {
        assertEquals(5L, WatermarkCarry.lowest(List.of(9L, 5L, 7L)));
        assertEquals(Long.MIN_VALUE, WatermarkCarry.lowest(List.of()));
        assertEquals(Long.MIN_VALUE, WatermarkCarry.lowest(List.of(9L, Long.MIN_VALUE)));
    }
}
