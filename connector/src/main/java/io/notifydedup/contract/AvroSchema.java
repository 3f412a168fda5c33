package io.notifydedup.contract;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;

/**
 * An Avro schema as read from a {@code .avsc} file: the subset the data contract uses (records,
 * enums, arrays, maps, unions, primitives). Field order and enum symbols are taken from the file
 * and from nowhere else; {@link AvroReader} and {@link AvroWriter} walk this tree.
 */
public final class AvroSchema implements Serializable {
    private static final long serialVersionUID = 1L;

    /** The Avro types this contract can hold. */
    public enum Kind {
        NULL, BOOLEAN, INT, LONG, FLOAT, DOUBLE, BYTES, STRING, RECORD, ENUM, ARRAY, MAP, UNION
    }

    /** One field of a record, at its position in the file. */
    public static final class Field implements Serializable {
        private static final long serialVersionUID = 1L;
        public final String name;
        public final AvroSchema schema;
        public final int pos;

        Field(String name, AvroSchema schema, int pos) {
            this.name = name;
            this.schema = schema;
            this.pos = pos;
        }
    }

    public final Kind kind;
    /** The full name of a record or enum; null for the other kinds. */
    public final String name;
    private final List<Field> fields;
    private final Map<String, Integer> fieldIndex;
    private final List<String> symbols;
    /** The items of an array, the values of a map. */
    public final AvroSchema element;
    private final List<AvroSchema> branches;

    private AvroSchema(
            Kind kind, String name, List<Field> fields, List<String> symbols, AvroSchema element, List<AvroSchema> branches) {
        this.kind = kind;
        this.name = name;
        this.fields = fields;
        this.symbols = symbols;
        this.element = element;
        this.branches = branches;
        Map<String, Integer> index = new HashMap<>();
        for (Field f : fields) {
            index.put(f.name, f.pos);
        }
        this.fieldIndex = index;
    }

    private static AvroSchema of(Kind kind) {
        return new AvroSchema(kind, null, List.of(), List.of(), null, List.of());
    }

    public List<Field> fields() {
        return Collections.unmodifiableList(fields);
    }

    public List<String> symbols() {
        return Collections.unmodifiableList(symbols);
    }

    public List<AvroSchema> branches() {
        return Collections.unmodifiableList(branches);
    }

    /** The position of a field of this record, or -1. */
    public int indexOf(String field) {
        Integer i = fieldIndex.get(field);
        return i == null ? -1 : i;
    }

    /** The position of a field that must be there. */
    public int require(String field) {
        int i = indexOf(field);
        if (i < 0) {
            throw new IllegalArgumentException(name + " has no field " + field);
        }
        return i;
    }

    public Field field(String name) {
        return fields.get(require(name));
    }

    /** The position of an enum symbol, or -1. */
    public int symbolIndex(String symbol) {
        return symbols.indexOf(symbol);
    }

    /** For a union of null and one type: that type; otherwise null. */
    public AvroSchema nonNullBranch() {
        if (kind != Kind.UNION || branches.size() != 2) {
            return null;
        }
        if (branches.get(0).kind == Kind.NULL) {
            return branches.get(1);
        }
        return branches.get(1).kind == Kind.NULL ? branches.get(0) : null;
    }

    /** The index of the null branch of a union, or -1. */
    public int nullBranch() {
        for (int i = 0; i < branches.size(); i++) {
            if (branches.get(i).kind == Kind.NULL) {
                return i;
            }
        }
        return -1;
    }

    /** The same shape (kinds, names, fields, symbols), which is what the binary encoding depends on. */
    public boolean sameShape(AvroSchema other) {
        if (kind != other.kind) {
            return false;
        }
        switch (kind) {
            case RECORD:
                if (fields.size() != other.fields.size()) {
                    return false;
                }
                for (int i = 0; i < fields.size(); i++) {
                    if (!fields.get(i).name.equals(other.fields.get(i).name)
                            || !fields.get(i).schema.sameShape(other.fields.get(i).schema)) {
                        return false;
                    }
                }
                return true;
            case ENUM:
                return symbols.equals(other.symbols);
            case ARRAY:
            case MAP:
                return element.sameShape(other.element);
            case UNION:
                if (branches.size() != other.branches.size()) {
                    return false;
                }
                for (int i = 0; i < branches.size(); i++) {
                    if (!branches.get(i).sameShape(other.branches.get(i))) {
                        return false;
                    }
                }
                return true;
            default:
                return true;
        }
    }

    /**
     * Parses a schema; named records and enums are registered in {@code named} (by full and short
     * name) so that later schemas can refer to them, as LateNotice refers to NotificationRequest.
     */
    public static AvroSchema parse(JsonNode node, Map<String, AvroSchema> named, String namespace) {
        if (node.isTextual()) {
            return primitiveOrNamed(node.asText(), named, namespace);
        }
        if (node.isArray()) {
            List<AvroSchema> branches = new ArrayList<>();
            for (JsonNode b : node) {
                branches.add(parse(b, named, namespace));
            }
            return new AvroSchema(Kind.UNION, null, List.of(), List.of(), null, branches);
        }
        String type = node.path("type").asText();
        String ns = node.has("namespace") ? node.get("namespace").asText() : namespace;
        switch (type) {
            case "record": {
                String full = fullName(node.path("name").asText(), ns);
                List<Field> fields = new ArrayList<>();
                Iterator<JsonNode> it = node.path("fields").elements();
                int pos = 0;
                while (it.hasNext()) {
                    JsonNode f = it.next();
                    fields.add(new Field(f.path("name").asText(), parse(f.get("type"), named, ns), pos++));
                }
                AvroSchema record = new AvroSchema(Kind.RECORD, full, fields, List.of(), null, List.of());
                register(named, full, record);
                return record;
            }
            case "enum": {
                String full = fullName(node.path("name").asText(), ns);
                List<String> symbols = new ArrayList<>();
                for (JsonNode s : node.path("symbols")) {
                    symbols.add(s.asText());
                }
                AvroSchema e = new AvroSchema(Kind.ENUM, full, List.of(), symbols, null, List.of());
                register(named, full, e);
                return e;
            }
            case "array":
                return new AvroSchema(Kind.ARRAY, null, List.of(), List.of(), parse(node.get("items"), named, ns), List.of());
            case "map":
                return new AvroSchema(Kind.MAP, null, List.of(), List.of(), parse(node.get("values"), named, ns), List.of());
            default:
                // {"type": "long", "logicalType": "timestamp-millis"}: the wire is the plain type
                return primitiveOrNamed(type, named, ns);
        }
    }

    private static String fullName(String name, String namespace) {
        return name.contains(".") || namespace == null || namespace.isEmpty() ? name : namespace + "." + name;
    }

    private static void register(Map<String, AvroSchema> named, String full, AvroSchema schema) {
        named.put(full, schema);
        named.put(full.substring(full.lastIndexOf('.') + 1), schema);
    }

    private static AvroSchema primitiveOrNamed(String type, Map<String, AvroSchema> named, String namespace) {
        switch (type) {
            case "null":
                return of(Kind.NULL);
            case "boolean":
                return of(Kind.BOOLEAN);
            case "int":
                return of(Kind.INT);
            case "long":
                return of(Kind.LONG);
            case "float":
                return of(Kind.FLOAT);
            case "double":
                return of(Kind.DOUBLE);
            case "bytes":
                return of(Kind.BYTES);
            case "string":
                return of(Kind.STRING);
            default:
                AvroSchema found = named.get(fullName(type, namespace));
                if (found == null) {
                    found = named.get(type);
                }
                if (found == null) {
                    throw new IllegalArgumentException("unknown Avro type " + type);
                }
                return found;
        }
    }
}
