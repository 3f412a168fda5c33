package io.notifydedup.flink;

import io.notifydedup.contract.AvroSchema;
import io.notifydedup.contract.Contract;

import org.apache.flink.api.common.typeinfo.BasicArrayTypeInfo;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.types.Row;

import java.util.List;

/**
 * The types of the records between the job's operators, all derived from the contract: a request
 * as parsed (a field per field of its schema), a mini-batch as it goes into Python (a column per
 * {@code boundary.batch} entry of schemas/contract.json), the verdicts that come back (a column per
 * {@code boundary.verdicts} entry), and a routed output record.
 */
public final class Boundary {
    /**
     * Fields of an {@link #item}: the dedup key, where it was read, the request, or the encoded
     * InvalidRecord, and the key's 64-bit hash.
     */
    static final int KEY = 0;
    static final int TOPIC = 1;
    static final int PARTITION = 2;
    static final int OFFSET = 3;
    static final int REQUEST = 4;
    static final int INVALID = 5;
    static final int KEY_HASH = 6;

    private Boundary() {}

    /** The Flink type of a value of an Avro schema, as {@link io.notifydedup.contract.AvroReader} reads it. */
    static TypeInformation<?> typeOf(AvroSchema s) {
        switch (s.kind) {
            case BOOLEAN:
                return Types.BOOLEAN;
            case INT:
            case ENUM:
                return Types.INT;
            case LONG:
                return Types.LONG;
            case FLOAT:
                return Types.FLOAT;
            case DOUBLE:
                return Types.DOUBLE;
            case BYTES:
                return Types.PRIMITIVE_ARRAY(Types.BYTE);
            case STRING:
                return Types.STRING;
            case RECORD: {
                List<AvroSchema.Field> fields = s.fields();
                String[] names = new String[fields.size()];
                TypeInformation<?>[] types = new TypeInformation<?>[fields.size()];
                for (AvroSchema.Field f : fields) {
                    names[f.pos] = f.name;
                    types[f.pos] = typeOf(f.schema);
                }
                return Types.ROW_NAMED(names, types);
            }
            case ARRAY:
                return Types.LIST(typeOf(s.element));
            case MAP:
                return Types.MAP(Types.STRING, typeOf(s.element));
            case UNION: {
                AvroSchema branch = s.nonNullBranch();
                if (branch == null) {
                    throw new IllegalArgumentException("only unions of null and one type cross the job");
                }
                return typeOf(branch);
            }
            default:
                throw new IllegalArgumentException("no Flink type for Avro " + s.kind);
        }
    }

    /** A record's fields (as AvroReader reads them) as a Row of {@link #typeOf}; nested records too. */
    static Row row(AvroSchema s, Object[] fields) {
        Row row = new Row(fields.length);
        for (AvroSchema.Field f : s.fields()) {
            Object v = fields[f.pos];
            AvroSchema fs = f.schema.kind == AvroSchema.Kind.UNION ? f.schema.nonNullBranch() : f.schema;
            row.setField(f.pos, v != null && fs != null && fs.kind == AvroSchema.Kind.RECORD ? row(fs, (Object[]) v) : v);
        }
        return row;
    }

    /**
     * A request as it crosses the keyBy: {@code Row(dedup_key, topic, partition, offset, request,
     * invalid, key_hash)}.
     */
    public static TypeInformation<Row> item() {
        return Types.ROW(
                Types.STRING, Types.STRING, Types.INT, Types.LONG,
                typeOf(Contract.packaged().request()), Types.PRIMITIVE_ARRAY(Types.BYTE), Types.LONG);
    }

    /** {@code Row(shard, item)}: keyed by shard the way PyFlink's keyed operators expect (KeyByKeySelector). */
    public static TypeInformation<Row> sharded() {
        return Types.ROW(Types.INT, item());
    }

    /** {@code Row(shard, Row(seq, column...))}: one shard's mini-batch, a column per boundary.batch entry. */
    public static TypeInformation<Row> batch() {
        return Types.ROW(Types.INT, columns(Contract.packaged().batchColumns));
    }

    /** {@code Row(seq, column...)}: the verdicts of one mini-batch, a column per boundary.verdicts entry. */
    public static TypeInformation<Row> verdicts() {
        return columns(Contract.packaged().verdictColumns);
    }

    /** {@code Row(topic, key, value)} for {@link RoutedRecordSerializer}. */
    public static TypeInformation<Row> routed() {
        return Types.ROW_NAMED(
                new String[] {"topic", "key", "value"},
                Types.STRING, Types.PRIMITIVE_ARRAY(Types.BYTE), Types.PRIMITIVE_ARRAY(Types.BYTE));
    }

    private static TypeInformation<Row> columns(List<Contract.Column> columns) {
        String[] names = new String[columns.size() + 1];
        TypeInformation<?>[] types = new TypeInformation<?>[columns.size() + 1];
        names[0] = "seq";
        types[0] = Types.LONG;
        for (int i = 0; i < columns.size(); i++) {
            names[i + 1] = columns.get(i).name;
            types[i + 1] = columnType(columns.get(i).type);
        }
        return Types.ROW_NAMED(names, types);
    }

    static TypeInformation<?> columnType(String type) {
        switch (type) {
            case "string":
                return BasicArrayTypeInfo.STRING_ARRAY_TYPE_INFO;
            case "long":
                return BasicArrayTypeInfo.LONG_ARRAY_TYPE_INFO;
            case "int":
                return BasicArrayTypeInfo.INT_ARRAY_TYPE_INFO;
            default:
                throw new IllegalArgumentException("no column type " + type);
        }
    }
}
