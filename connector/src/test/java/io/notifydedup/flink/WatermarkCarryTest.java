package io.notifydedup.flink;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Test;

import java.util.List;

class WatermarkCarryTest {
    private static final long NONE = Long.MIN_VALUE;

    @Test
    void theLowestOfTheActiveSubtasksIsRestored() {
        assertEquals(5L, WatermarkCarry.restoredWatermark(List.of(9L, 5L, 7L), List.of()));
        // an active subtask without a watermark held downstream back: nothing to carry
        assertEquals(NONE, WatermarkCarry.restoredWatermark(List.of(9L, NONE), List.of(3L)));
        // idle subtasks held nothing back while others were active
        assertEquals(9L, WatermarkCarry.restoredWatermark(List.of(9L), List.of(3L)));
    }

    @Test
    void withEverySubtaskIdleTheLowestTheyHadIsRestored() {
        assertEquals(7L, WatermarkCarry.restoredWatermark(List.of(), List.of(9L, 7L)));
        assertEquals(NONE, WatermarkCarry.restoredWatermark(List.of(), List.of()));
    }
}
