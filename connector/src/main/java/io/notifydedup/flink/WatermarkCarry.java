package io.notifydedup.flink;

import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.runtime.state.StateInitializationContext;
import org.apache.flink.runtime.state.StateSnapshotContext;
import org.apache.flink.streaming.api.operators.AbstractStreamOperator;
import org.apache.flink.streaming.api.operators.OneInputStreamOperator;
import org.apache.flink.streaming.api.watermark.Watermark;
import org.apache.flink.streaming.runtime.streamrecord.StreamRecord;

import java.util.List;

/**
 * Carries the event-time watermark across a restore.
 *
 * <p>Flink does not checkpoint watermarks: a job restored from a checkpoint or savepoint starts
 * with none, and until its sources emit the first one every replayed request would be judged on
 * time, including requests the failed run had already judged late. This operator passes records
 * through unchanged, remembers the highest watermark it forwarded, and keeps it in union operator
 * state. On restore every subtask takes the lowest value of all subtasks (exactly what the
 * downstream operator had seen, since its watermark is the minimum of its inputs) and emits it
 * before any record, so the downstream dedup decides lateness as it did before the failure. Lower
 * watermarks from the restarted sources are dropped, keeping the watermark monotonic.
 */
public final class WatermarkCarry extends AbstractStreamOperator<Object>
        implements OneInputStreamOperator<Object, Object> {
    private static final long serialVersionUID = 1L;

    private transient ListState<Long> carried;
    private transient long emitted = Long.MIN_VALUE;
    private transient long restored = Long.MIN_VALUE;

    @Override
    public void initializeState(StateInitializationContext context) throws Exception {
        super.initializeState(context);
        carried = context.getOperatorStateStore()
                .getUnionListState(new ListStateDescriptor<>("carried-watermark", Types.LONG));
        emitted = Long.MIN_VALUE;
        restored = Long.MIN_VALUE;
        if (context.isRestored()) {
            restored = lowest(carried.get());
        }
    }

    /** The lowest of the subtasks' watermarks, or none if any subtask had none. */
    static long lowest(Iterable<Long> values) {
        long low = Long.MAX_VALUE;
        boolean any = false;
        for (Long v : values) {
            any = true;
            low = Math.min(low, v);
        }
        return any ? low : Long.MIN_VALUE;
    }

    @Override
    public void open() throws Exception {
        super.open();
        if (restored > Long.MIN_VALUE) {
            emitted = restored;
            output.emitWatermark(new Watermark(restored));
        }
    }

    @Override
    public void processElement(StreamRecord<Object> element) {
        output.collect(element);
    }

    @Override
    public void processWatermark(Watermark mark) throws Exception {
        if (mark.getTimestamp() > emitted) {
            emitted = mark.getTimestamp();
            super.processWatermark(mark);
        }
    }

    @Override
    public void snapshotState(StateSnapshotContext context) throws Exception {
        super.snapshotState(context);
        carried.update(List.of(emitted));
    }
}
