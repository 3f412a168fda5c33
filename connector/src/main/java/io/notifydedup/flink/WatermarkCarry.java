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
import org.apache.flink.streaming.runtime.watermarkstatus.WatermarkStatus;

import java.util.List;

/**
 * Carries the event-time watermark across a restore.
 *
 * <p>Flink does not checkpoint watermarks: a job restored from a checkpoint or savepoint starts
 * with none, and until its sources emit the first one every replayed request would be judged on
 * time, including requests the failed run had already judged late. This operator passes records
 * through unchanged, remembers the highest watermark it forwarded, and keeps it in union operator
 * state. On restore every subtask takes the lowest value of all subtasks (at most what the
 * downstream operator had seen, since its watermark is the minimum of its inputs) and emits it
 * before any record, so the downstream dedup decides lateness as it did before the failure. Lower
 * watermarks from the restarted sources are dropped, keeping the watermark monotonic.
 *
 * <p>The job has two of them: one behind the sources, and one right after the keyBy, chained to
 * the Python dedup operator. The second is the one that counts: a watermark emitted before the
 * shuffle reaches a downstream subtask only once every upstream channel has delivered it, and a
 * record on a channel that was first can overtake it (seen at parallelism 4: the first request
 * after a restore judged on time); after the shuffle nothing is in between.
 *
 * <p>Idle inputs (a source subtask without a partition when the job runs at a parallelism above
 * the partition count, or partitions without records for the idleness timeout) hold nothing back
 * downstream, and a downstream operator keeps its watermark while all its inputs are idle. So
 * each subtask stores its watermark with whether it was idle: the restored value is the lowest
 * watermark of the subtasks that were active (none if one of them had none yet); when all were
 * idle, the lowest watermark any of them had emitted. Either is at most what downstream had, so
 * the carry never makes an on-time request late.
 */
public final class WatermarkCarry extends AbstractStreamOperator<Object>
        implements OneInputStreamOperator<Object, Object> {
    private static final long serialVersionUID = 1L;

    private transient ListState<Long> carried;
    private transient ListState<Long> carriedIdle;
    private transient long emitted;
    private transient long restored;
    private transient boolean idle;

    @Override
    public void initializeState(StateInitializationContext context) throws Exception {
        super.initializeState(context);
        carried = context.getOperatorStateStore()
                .getUnionListState(new ListStateDescriptor<>("carried-watermark", Types.LONG));
        carriedIdle = context.getOperatorStateStore()
                .getUnionListState(new ListStateDescriptor<>("carried-watermark-idle", Types.LONG));
        emitted = Long.MIN_VALUE;
        restored = Long.MIN_VALUE;
        idle = false;
        if (context.isRestored()) {
            restored = restoredWatermark(carried.get(), carriedIdle.get());
        }
    }

    /**
     * What to emit on restore: the lowest watermark of the active subtasks; with none active, the
     * lowest of the idle subtasks' watermarks.
     */
    static long restoredWatermark(Iterable<Long> active, Iterable<Long> idle) {
        return active.iterator().hasNext() ? lowest(active) : lowest(idle);
    }

    /** The lowest of the values, or none if there are none. */
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
    public void processWatermarkStatus(WatermarkStatus status) throws Exception {
        idle = status.isIdle();
        super.processWatermarkStatus(status);
    }

    @Override
    public void snapshotState(StateSnapshotContext context) throws Exception {
        super.snapshotState(context);
        carried.update(idle ? List.of() : List.of(emitted));
        carriedIdle.update(idle && emitted > Long.MIN_VALUE ? List.of(emitted) : List.of());
    }
}
