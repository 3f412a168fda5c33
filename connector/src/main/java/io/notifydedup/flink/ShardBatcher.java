package io.notifydedup.flink;

import org.apache.flink.api.common.typeinfo.BasicArrayTypeInfo;
import org.apache.flink.api.common.typeinfo.BasicTypeInfo;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.typeutils.RowTypeInfo;
import org.apache.flink.streaming.api.operators.AbstractStreamOperator;
import org.apache.flink.streaming.api.operators.OneInputStreamOperator;
import org.apache.flink.streaming.api.watermark.Watermark;
import org.apache.flink.streaming.runtime.streamrecord.StreamRecord;
import org.apache.flink.types.Row;

import java.lang.reflect.Array;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Groups the requests of each shard into mini-batches, so the Python dedup operator is called
 * once per batch rather than once per request (each call into the embedded interpreter, and each
 * state access from it, has a fixed cost that dominated the per-request time).
 *
 * <p>Input {@code Row(shard, request)} from {@link ShardedRequests}; output
 * {@code Row(shard, Row(dedup_key[], event_time[], ...))}: the requests of one shard in the order
 * they arrived, a column per field of {@link ShardedRequests#payloadType()}. Columns, not an
 * array of rows: PyFlink's converters between Java and Python reuse one row object per type, so
 * an array of rows would arrive as n references to its last row.
 *
 * <p>A batch never crosses a watermark or a checkpoint barrier: everything buffered is emitted
 * before a watermark is forwarded, before a barrier ({@link #prepareSnapshotPreBarrier}) and at
 * the end of input. So each request is judged against the same watermark as without batching,
 * the operator holds nothing at a checkpoint (it has no state), and batching adds at most
 * {@code maxDelayMs} of latency (a processing-time timer flushes what waits).
 */
public final class ShardBatcher extends AbstractStreamOperator<Row> implements OneInputStreamOperator<Row, Row> {
    private static final long serialVersionUID = 1L;

    private final int maxBuffered;
    private final long maxDelayMs;
    private transient Map<Object, List<Row>> batches;
    private transient int buffered;

    /**
     * @param maxBuffered requests held over all shards before everything is emitted
     * @param maxDelayMs the longest a request waits in a batch
     */
    public ShardBatcher(int maxBuffered, long maxDelayMs) {
        if (maxBuffered < 1 || maxDelayMs < 1) {
            throw new IllegalArgumentException("maxBuffered and maxDelayMs must be positive");
        }
        this.maxBuffered = maxBuffered;
        this.maxDelayMs = maxDelayMs;
    }

    private static final RowTypeInfo REQUEST = (RowTypeInfo) ShardedRequests.payloadType();

    /** {@code Row(shard, Row(column...))}: a column per field of {@link ShardedRequests#payloadType()}. */
    public static TypeInformation<Row> batchType() {
        TypeInformation<?>[] columns = new TypeInformation<?>[REQUEST.getArity()];
        for (int c = 0; c < columns.length; c++) {
            columns[c] = columnType(REQUEST.getTypeAt(c));
        }
        return Types.ROW(Types.INT, Types.ROW_NAMED(REQUEST.getFieldNames(), columns));
    }

    /** A boxed basic type as its basic array ({@code String[]}, {@code Long[]}), else an object array. */
    private static TypeInformation<?> columnType(TypeInformation<?> field) {
        if (field instanceof BasicTypeInfo) {
            return BasicArrayTypeInfo.getInfoFor(Array.newInstance(field.getTypeClass(), 0).getClass());
        }
        return Types.OBJECT_ARRAY(field);
    }

    /** The requests as columns, each of the type {@link #batchType()} gives it. */
    static Row columns(List<Row> requests) {
        int n = requests.size();
        Row out = new Row(REQUEST.getArity());
        for (int c = 0; c < REQUEST.getArity(); c++) {
            Object[] column = (Object[]) Array.newInstance(REQUEST.getTypeAt(c).getTypeClass(), n);
            for (int i = 0; i < n; i++) {
                column[i] = requests.get(i).getField(c);
            }
            out.setField(c, column);
        }
        return out;
    }

    @Override
    public void open() throws Exception {
        super.open();
        batches = new HashMap<>();
        buffered = 0;
        getProcessingTimeService().scheduleWithFixedDelay(now -> flush(), maxDelayMs, maxDelayMs);
    }

    @Override
    public void processElement(StreamRecord<Row> element) {
        Row row = element.getValue();
        batches.computeIfAbsent(row.getField(0), k -> new ArrayList<>()).add((Row) row.getField(1));
        if (++buffered >= maxBuffered) {
            flush();
        }
    }

    @Override
    public void processWatermark(Watermark mark) throws Exception {
        flush();
        super.processWatermark(mark);
    }

    @Override
    public void prepareSnapshotPreBarrier(long checkpointId) throws Exception {
        flush();
        super.prepareSnapshotPreBarrier(checkpointId);
    }

    @Override
    public void finish() throws Exception {
        flush();
        super.finish();
    }

    private void flush() {
        if (buffered == 0) {
            return;
        }
        StreamRecord<Row> out = new StreamRecord<>(null);
        for (Map.Entry<Object, List<Row>> e : batches.entrySet()) {
            output.collect(out.replace(Row.of(e.getKey(), columns(e.getValue()))));
        }
        batches = new HashMap<>();
        buffered = 0;
    }
}
