package io.notifydedup.flink;

import io.notifydedup.contract.Contract;

import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.streaming.api.operators.AbstractStreamOperator;
import org.apache.flink.streaming.api.operators.OneInputStreamOperator;
import org.apache.flink.streaming.api.watermark.Watermark;
import org.apache.flink.streaming.runtime.streamrecord.StreamRecord;
import org.apache.flink.types.Row;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Groups the requests of each shard into mini-batches, after the keyBy and chained with the Python
 * dedup operator, so Python is called once per batch rather than once per request (each call into
 * the embedded interpreter, and each state access from it, has a fixed cost).
 *
 * <p>Input {@code Row(shard, item)} ({@link Boundary#sharded()}); output {@code Row(shard, Row(seq,
 * column...))} ({@link Boundary#batch()}): of the batch's usable requests, a column per
 * {@code boundary.batch} entry of the contract (columns, not rows: PyFlink's converters reuse one
 * row object per type). The items themselves, invalid ones included, go to {@link RouteOutcomes}
 * through {@link BatchHandoff}; a batch of invalid records only is sent with empty columns.
 *
 * <p>A batch never crosses a watermark or a checkpoint barrier: everything buffered is emitted
 * before a watermark is forwarded, before a barrier ({@link #prepareSnapshotPreBarrier}) and at the
 * end of input. So each request is judged against the same watermark as without batching, nothing
 * is held at a checkpoint (the operator has no state), and batching adds at most {@code maxDelayMs}
 * of latency (a processing-time timer flushes what waits). A batch is bounded by count and bytes.
 */
public final class ShardBatcher extends AbstractStreamOperator<Row> implements OneInputStreamOperator<Row, Row> {
    private static final long serialVersionUID = 1L;

    private final int maxBuffered;
    private final long maxBufferedBytes;
    private final long maxDelayMs;
    private transient Map<Object, List<Row>> batches;
    private transient int buffered;
    private transient long bufferedBytes;
    private transient long seq;
    private transient ArrayDeque<BatchHandoff.Batch> handoff;
    private transient Column[] columns;

    /** How one column is read off an item. */
    private interface Column {
        Object get(Row item, Row request);
    }

    /**
     * @param maxBuffered requests held over all shards before everything is emitted
     * @param maxBufferedBytes the most bytes of requests (about their serialized size) held at once: a
     *     request that would pass it has what is held emitted first, so only a larger request goes alone
     * @param maxDelayMs the longest a request waits in a batch
     */
    public ShardBatcher(int maxBuffered, long maxBufferedBytes, long maxDelayMs) {
        if (maxBuffered < 1 || maxBufferedBytes < 1 || maxDelayMs < 1) {
            throw new IllegalArgumentException("batch bounds must be positive");
        }
        this.maxBuffered = maxBuffered;
        this.maxBufferedBytes = maxBufferedBytes;
        this.maxDelayMs = maxDelayMs;
    }

    public static TypeInformation<Row> batchType() {
        return Boundary.batch();
    }

    @Override
    public void open() throws Exception {
        super.open();
        batches = new HashMap<>();
        buffered = 0;
        bufferedBytes = 0;
        seq = 0;
        handoff = BatchHandoff.queue(getRuntimeContext());
        Contract contract = Contract.packaged();
        List<Contract.Column> spec = contract.batchColumns;
        columns = new Column[spec.size()];
        for (int c = 0; c < columns.length; c++) {
            String name = spec.get(c).name;
            if (name.equals("dedup_key")) {
                columns[c] = (item, request) -> item.getField(Boundary.KEY);
            } else if (name.equals("key_hash")) {
                columns[c] = (item, request) -> item.getField(Boundary.KEY_HASH);
            } else {
                int field = contract.request().require(name);
                columns[c] = (item, request) -> request.getField(field);
            }
        }
        getProcessingTimeService().scheduleWithFixedDelay(now -> flush(), maxDelayMs, maxDelayMs);
    }

    @Override
    public void processElement(StreamRecord<Row> element) {
        Row row = element.getValue();
        Row item = (Row) row.getField(1);
        long size = sizeOf(item);
        if (buffered > 0 && bufferedBytes + size > maxBufferedBytes) {
            flush(); // a batch stays within the bound; only a request larger than it goes alone
        }
        batches.computeIfAbsent(row.getField(0), k -> new ArrayList<>()).add(item);
        bufferedBytes += size;
        if (++buffered >= maxBuffered || bufferedBytes >= maxBufferedBytes) {
            flush();
        }
    }

    /** About the bytes an item holds: its encoded InvalidRecord, or its request's strings. */
    static long sizeOf(Row item) {
        byte[] invalid = (byte[]) item.getField(Boundary.INVALID);
        if (invalid != null) {
            return invalid.length;
        }
        long n = 64;
        Row request = (Row) item.getField(Boundary.REQUEST);
        for (int i = 0; i < request.getArity(); i++) {
            Object v = request.getField(i);
            if (v instanceof String s) {
                n += s.length();
            } else if (v instanceof Map<?, ?> m) {
                for (Map.Entry<?, ?> e : m.entrySet()) {
                    n += ((String) e.getKey()).length() + ((String) e.getValue()).length() + 2;
                }
            }
        }
        return n;
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

    @Override
    public void close() throws Exception {
        BatchHandoff.release(getRuntimeContext());
        super.close();
    }

    private void flush() {
        if (buffered == 0) {
            return;
        }
        StreamRecord<Row> out = new StreamRecord<>(null);
        Map<Object, List<Row>> full = batches;
        batches = new HashMap<>();
        buffered = 0;
        bufferedBytes = 0;
        for (Map.Entry<Object, List<Row>> e : full.entrySet()) {
            long n = ++seq;
            handoff.addLast(new BatchHandoff.Batch(n, e.getValue()));
            output.collect(out.replace(Row.of(e.getKey(), columns(n, e.getValue()))));
        }
    }

    /** {@code Row(seq, column...)} of the usable requests among {@code items}, in order. */
    private Row columns(long n, List<Row> items) {
        List<Row> usable = new ArrayList<>(items.size());
        for (Row item : items) {
            if (item.getField(Boundary.REQUEST) != null) {
                usable.add(item);
            }
        }
        Row out = new Row(columns.length + 1);
        out.setField(0, n);
        List<Contract.Column> spec = Contract.packaged().batchColumns;
        for (int c = 0; c < columns.length; c++) {
            Object[] column = newColumn(spec.get(c).type, usable.size());
            for (int i = 0; i < column.length; i++) {
                Row item = usable.get(i);
                column[i] = columns[c].get(item, (Row) item.getField(Boundary.REQUEST));
            }
            out.setField(c + 1, column);
        }
        return out;
    }

    static Object[] newColumn(String type, int n) {
        switch (type) {
            case "string":
                return new String[n];
            case "long":
                return new Long[n];
            case "int":
                return new Integer[n];
            default:
                throw new IllegalArgumentException("no column type " + type);
        }
    }
}
