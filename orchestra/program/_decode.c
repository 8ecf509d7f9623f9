/* orchestra.program._decode: _Fast.evalues and _Fast.instructions of
 * orchestra/program/_reader.py in C (optional; the Python code is the reference and the fallback),
 * and the per-value and per-instruction fast paths of its _verify_plan (plain_values,
 * plain_instructions, see there) and of tensors_with_extra_info (extra_info_values).
 *
 * evalues(buf, end, start, n) and instructions(buf, end, start, n) decode the n tables a vector
 * of offsets at ``start`` points to, exactly as the Python methods do: every check they make
 * (bounds against ``end``, alignment, vtable and table sizes, field offsets inside their table,
 * union tags, vector lengths, null-terminated strict UTF-8 strings), the same objects (the
 * schema's frozen slots dataclasses, built without running their __init__: every slot is set
 * here), and the same object-budget charge. Each returns (tuple, spent), or None where the
 * Python code would raise (_Fallback, struct.error, ...) - the caller then raises _Fallback -
 * and so never reads outside buf[0:end]. The classes come from Python once, through setup().
 * Three things differ, unobservably to a reader of the objects: equal short int vectors decoded
 * in one call are one (immutable) tuple, the garbage collector waits until a call returns, and
 * what is built here is not tracked by the collector. CPython itself untracks a tuple of ints
 * the first time it scans it; the frozen objects here hold only ints, floats, strings, None and
 * each other, made bottom-up, so no reference cycle can pass through them either. A program's
 * thousands of values then cost no collector scan: that scan (after load_program turns the
 * collector back on) took 40 % of loading the real models once the decoding itself was in C.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <limits.h>
#include <stdint.h>
#include <string.h>

#if PY_VERSION_HEX >= 0x030C0000
#define OBJECT_EX_MEMBER Py_T_OBJECT_EX
#else
#define OBJECT_EX_MEMBER T_OBJECT_EX
#endif

/* -- the classes built here, and their fields in dataclass order ----------------------------- */

enum {
    C_EVALUE,
    C_INSTRUCTION,
    C_NULL,
    C_INT,
    C_BOOL,
    C_DOUBLE,
    C_TENSOR,
    C_STRING,
    C_INTLIST,
    C_DOUBLELIST,
    C_BOOLLIST,
    C_TENSORLIST,
    C_OPTIONALTENSORLIST,
    C_ALLOCATIONDETAILS,
    C_EXTRATENSORINFO,
    C_KERNELCALL,
    C_DELEGATECALL,
    C_MOVECALL,
    C_JUMPFALSECALL,
    C_FREECALL,
    NCLASSES
};

#define MAXFIELDS 10

typedef struct {
    const char *name;
    const char *fields[MAXFIELDS + 1]; /* NULL-terminated */
} ClassSpec;

static const ClassSpec SPECS[NCLASSES] = {
    [C_EVALUE] = {"EValue", {"val", NULL}},
    [C_INSTRUCTION] = {"Instruction", {"instr_args", NULL}},
    [C_NULL] = {"Null", {NULL}},
    [C_INT] = {"Int", {"int_val", NULL}},
    [C_BOOL] = {"Bool", {"bool_val", NULL}},
    [C_DOUBLE] = {"Double", {"double_val", NULL}},
    [C_TENSOR] = {"Tensor",
                  {"scalar_type", "storage_offset", "sizes", "dim_order", "requires_grad", "data_buffer_idx",
                   "allocation_info", "layout", "shape_dynamism", "extra_tensor_info", NULL}},
    [C_STRING] = {"String", {"string_val", NULL}},
    [C_INTLIST] = {"IntList", {"items", NULL}},
    [C_DOUBLELIST] = {"DoubleList", {"items", NULL}},
    [C_BOOLLIST] = {"BoolList", {"items", NULL}},
    [C_TENSORLIST] = {"TensorList", {"items", NULL}},
    [C_OPTIONALTENSORLIST] = {"OptionalTensorList", {"items", NULL}},
    [C_ALLOCATIONDETAILS] = {"AllocationDetails", {"memory_id", "memory_offset_low", "memory_offset_high", NULL}},
    [C_EXTRATENSORINFO] = {"ExtraTensorInfo", {"mutable_data_segments_idx", "fully_qualified_name", "location", NULL}},
    [C_KERNELCALL] = {"KernelCall", {"op_index", "args", NULL}},
    [C_DELEGATECALL] = {"DelegateCall", {"delegate_index", "args", NULL}},
    [C_MOVECALL] = {"MoveCall", {"move_from", "move_to", NULL}},
    [C_JUMPFALSECALL] = {"JumpFalseCall", {"cond_value_index", "destination_instruction", NULL}},
    [C_FREECALL] = {"FreeCall", {"value_index", NULL}},
};

typedef struct {
    PyTypeObject *type; /* strong reference */
    int nfields;
    Py_ssize_t offset[MAXFIELDS]; /* of each field's slot in an instance */
} ClassInfo;

#define MAXKINDS 255

static ClassInfo classes[NCLASSES];
static int ready;
static int nkernel; /* len(KERNEL_TYPES) */
static int kernel_kind[MAXKINDS]; /* union tag - 1 -> C_* */
static int ninstr; /* len(INSTRUCTION_TYPES) */
static int instr_kind[MAXKINDS];

/* A new instance of class k with fields vals[0..nfields-1]. Steals every reference in vals,
 * also on failure; returns NULL if any of them is NULL (an error is then set) or on failure. */
static PyObject *make(int k, PyObject **vals) {
    const ClassInfo *c = &classes[k];
    int i;
    for (i = 0; i < c->nfields; i++) {
        if (vals[i] == NULL) goto fail;
    }
    PyObject *o = c->type->tp_alloc(c->type, 0);
    if (o == NULL) goto fail;
    for (i = 0; i < c->nfields; i++) {
        *(PyObject **)((char *)o + c->offset[i]) = vals[i]; /* the slot is NULL in a fresh object */
    }
    if (PyObject_GC_IsTracked(o)) PyObject_GC_UnTrack(o); /* see the top */
    return o;
fail:
    for (i = 0; i < c->nfields; i++) Py_XDECREF(vals[i]);
    return NULL;
}

static PyObject *make1(int k, PyObject *v) { return make(k, &v); }

static PyObject *make2(int k, PyObject *a, PyObject *b) {
    PyObject *v[2] = {a, b};
    return make(k, v);
}

static PyObject *make3(int k, PyObject *a, PyObject *b, PyObject *c) {
    PyObject *v[3] = {a, b, c};
    return make(k, v);
}

/* -- setup ------------------------------------------------------------------------------------- */

static void clear_classes(void) {
    ready = 0;
    for (int k = 0; k < NCLASSES; k++) Py_CLEAR(classes[k].type);
}

static int kinds_of(PyObject *seq, const char *what, int first, int last, int *kinds, int *count) {
    if (!PyTuple_Check(seq)) {
        PyErr_Format(PyExc_TypeError, "%s must be a tuple", what);
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    if (n > MAXKINDS) {
        PyErr_Format(PyExc_ValueError, "%s has more than %d types", what, MAXKINDS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(seq, i);
        int k;
        for (k = first; k <= last; k++) {
            if (t == (PyObject *)classes[k].type) break;
        }
        if (k > last) {
            PyErr_Format(PyExc_ValueError, "%s[%zd] is not one of the classes this module builds", what, i);
            return -1;
        }
        kinds[i] = k;
    }
    *count = (int)n;
    return 0;
}

PyDoc_STRVAR(setup_doc,
             "setup(classes, kernel_types, instruction_types)\n\n"
             "classes maps each schema class name this module builds to (class, field names in\n"
             "dataclass order); kernel_types and instruction_types are the union member classes in\n"
             "tag order. Checks that every field is a plain object slot of its class.");

static PyObject *setup(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *mapping, *ktypes, *itypes;
    if (!PyArg_ParseTuple(args, "O!OO", &PyDict_Type, &mapping, &ktypes, &itypes)) return NULL;
    clear_classes();
    for (int k = 0; k < NCLASSES; k++) {
        const ClassSpec *spec = &SPECS[k];
        ClassInfo *info = &classes[k];
        PyObject *entry = PyDict_GetItemString(mapping, spec->name); /* borrowed */
        if (entry == NULL || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2 ||
            !PyType_Check(PyTuple_GET_ITEM(entry, 0)) || !PyTuple_Check(PyTuple_GET_ITEM(entry, 1))) {
            PyErr_Format(PyExc_TypeError, "classes[%s] must be (class, tuple of field names)", spec->name);
            goto fail;
        }
        PyTypeObject *type = (PyTypeObject *)PyTuple_GET_ITEM(entry, 0);
        PyObject *names = PyTuple_GET_ITEM(entry, 1);
        if (type->tp_new != PyBaseObject_Type.tp_new || type->tp_alloc == NULL || type->tp_itemsize != 0) {
            PyErr_Format(PyExc_TypeError, "%s must be a plain class (object's __new__, no variable size)",
                         spec->name);
            goto fail;
        }
        int nf = 0;
        while (spec->fields[nf] != NULL) nf++;
        if (PyTuple_GET_SIZE(names) != nf) {
            PyErr_Format(PyExc_ValueError, "%s has %zd fields, expected %d", spec->name, PyTuple_GET_SIZE(names), nf);
            goto fail;
        }
        for (int i = 0; i < nf; i++) {
            PyObject *name = PyTuple_GET_ITEM(names, i);
            if (!PyUnicode_Check(name) || PyUnicode_CompareWithASCIIString(name, spec->fields[i]) != 0) {
                PyErr_Format(PyExc_ValueError, "field %d of %s is not %s", i, spec->name, spec->fields[i]);
                goto fail;
            }
            PyObject *d = PyObject_GetAttr((PyObject *)type, name);
            if (d == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_AttributeError)) goto fail;
                PyErr_Clear();
            }
            int ok = d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type);
            if (ok) {
                PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
                PyTypeObject *owner = ((PyDescrObject *)d)->d_type;
                ok = m->type == OBJECT_EX_MEMBER && !(m->flags & READONLY) && m->offset >= (Py_ssize_t)sizeof(PyObject) &&
                     m->offset + (Py_ssize_t)sizeof(PyObject *) <= type->tp_basicsize &&
                     PyType_IsSubtype(type, owner);
                for (int j = 0; ok && j < i; j++) ok = info->offset[j] != m->offset;
                if (ok) info->offset[i] = m->offset;
            }
            Py_XDECREF(d);
            if (!ok) {
                PyErr_Format(PyExc_TypeError, "%s.%s is not a writable object slot", spec->name, spec->fields[i]);
                goto fail;
            }
        }
        info->nfields = nf;
        Py_INCREF(type);
        info->type = type;
    }
    if (kinds_of(ktypes, "kernel_types", C_NULL, C_OPTIONALTENSORLIST, kernel_kind, &nkernel) < 0) goto fail;
    if (kinds_of(itypes, "instruction_types", C_KERNELCALL, C_FREECALL, instr_kind, &ninstr) < 0) goto fail;
    ready = 1;
    Py_RETURN_NONE;
fail:
    clear_classes();
    return NULL;
}

/* -- bounds-checked flatbuffer access ---------------------------------------------------------- */

static inline uint32_t rd_u16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }

static inline uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline int32_t rd_i32(const uint8_t *p) { return (int32_t)rd_u32(p); }

static inline uint64_t rd_u64(const uint8_t *p) { return (uint64_t)rd_u32(p) | (uint64_t)rd_u32(p + 4) << 32; }

static inline int64_t rd_i64(const uint8_t *p) { return (int64_t)rd_u64(p); }

static inline double rd_f64(const uint8_t *p) {
    uint64_t u = rd_u64(p);
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* A cache of checked vtables by position within one call (tables of one type share vtables).
 * Only an optimization: a miss checks the vtable again, a full probe run just skips caching. */
#define VTCAP 256
#define VTPROBE 8

typedef struct {
    int64_t vt; /* -1: empty */
    uint32_t vtsize, objsize;
} VtEntry;

/* Short int vectors decoded within one call, by content: tensors share a few shapes and dim
 * orders, so equal ones are one tuple (immutable, equal to what Python builds). Also only an
 * optimization: a full probe run decodes a new tuple. */
#define MEMOCAP 256
#define MEMOPROBE 8
#define MEMOMAXBYTES 64

typedef struct {
    const uint8_t *p; /* the elements in the buffer; NULL: empty */
    uint32_t nbytes;
    int kind;
    PyObject *tuple; /* strong reference */
} MemoEntry;

typedef struct {
    const uint8_t *b;
    int64_t end;
    int64_t spent; /* object budget charged: 1 per table, n per decoded vector, 1 per string */
    VtEntry vts[VTCAP];
    MemoEntry memo[MEMOCAP];
} Ctx;

typedef struct {
    int64_t pos, vt;
    uint32_t vtsize, objsize;
} Tab;

/* Every int-returning helper below returns 0 on success and -1 on failure: with no exception
 * set the bytes are unusual (the Python code raises there: fall back), with one it is an error. */

/* The table at pos (_Fast.table). */
static int table(Ctx *c, int64_t pos, Tab *t) {
    if (pos < 0 || pos + 4 > c->end || (pos & 3)) return -1;
    int64_t vt = pos - (int64_t)rd_i32(c->b + pos);
    c->spent += 1;
    if (vt < 0 || vt + 4 > c->end || (vt & 1)) return -1; /* before the lookup: -1 marks empty entries */
    uint32_t h = (uint32_t)(((uint64_t)vt * UINT64_C(0x9E3779B97F4A7C15)) >> 56) & (VTCAP - 1);
    VtEntry *slot = NULL;
    uint32_t vtsize, objsize;
    for (int k = 0; k < VTPROBE; k++) {
        VtEntry *e = &c->vts[(h + (uint32_t)k) & (VTCAP - 1)];
        if (e->vt == vt) {
            vtsize = e->vtsize;
            objsize = e->objsize;
            goto found;
        }
        if (e->vt < 0) {
            slot = e;
            break;
        }
    }
    vtsize = rd_u16(c->b + vt);
    objsize = rd_u16(c->b + vt + 2);
    if (vtsize < 4 || (vtsize & 1) || vt + (int64_t)vtsize > c->end || objsize < 4) return -1;
    if (slot != NULL) {
        slot->vt = vt;
        slot->vtsize = vtsize;
        slot->objsize = objsize;
    }
found:
    if (pos + (int64_t)objsize > c->end) return -1;
    t->pos = pos;
    t->vt = vt;
    t->vtsize = vtsize;
    t->objsize = objsize;
    return 0;
}

/* _VTable.layout of the spec ((0, sizes[0]), ..., (n - 1, sizes[n - 1])): the offsets of the
 * table's first n fields (0 when absent), each checked to lie inside the table. */
static int layout(const Ctx *c, const Tab *t, int n, const uint8_t *sizes, uint32_t *out) {
    for (int i = 0; i < n; i++) {
        uint32_t e = 4 + 2 * (uint32_t)i;
        uint32_t o = e + 2 <= t->vtsize ? rd_u16(c->b + t->vt + e) : 0;
        if (o && (o < 4 || o + sizes[i] > t->objsize)) return -1;
        out[i] = o;
    }
    return 0;
}

/* The table the offset at p points to (_Fast.ref); p + 4 <= end is known. */
static int ref(Ctx *c, int64_t p, Tab *t) {
    int64_t target = p + (int64_t)rd_u32(c->b + p);
    if (target + 4 > c->end) return -1;
    return table(c, target, t);
}

/* The vector the offset at p points to (_Fast.vector); p + 4 <= end is known. */
static int vector(Ctx *c, int64_t p, int elem, int decoded, int64_t *start, uint32_t *n) {
    int64_t v = p + (int64_t)rd_u32(c->b + p);
    if (v + 4 > c->end || (v & 3)) return -1;
    uint32_t m = rd_u32(c->b + v);
    if (v + 4 + (int64_t)m * elem > c->end) return -1;
    c->spent += decoded ? (int64_t)m : 1;
    *start = v + 4;
    *n = m;
    return 0;
}

/* _Fast.string: a null-terminated strict UTF-8 string, or NULL. */
static PyObject *string(Ctx *c, int64_t p) {
    int64_t start;
    uint32_t n;
    if (vector(c, p, 1, 0, &start, &n) < 0) return NULL;
    if (start + (int64_t)n >= c->end || c->b[start + n] != 0) return NULL;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)c->b + start, (Py_ssize_t)n, "strict");
    if (s == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) PyErr_Clear(); /* fall back */
    return s;
}

enum { E_I32, E_I64, E_U8, E_F64, E_BOOL };

/* The tuple of the n elements of kind e at start (in bounds, checked by vector()). */
static PyObject *scalars(const uint8_t *p, uint32_t n, int e) {
    PyObject *t = PyTuple_New((Py_ssize_t)n);
    if (t == NULL) return NULL;
    for (uint32_t i = 0; i < n; i++) {
        PyObject *x;
        switch (e) {
        case E_I32:
            x = PyLong_FromLong((long)rd_i32(p + 4 * (size_t)i));
            break;
        case E_I64:
            x = PyLong_FromLongLong((long long)rd_i64(p + 8 * (size_t)i));
            break;
        case E_U8:
            x = PyLong_FromLong((long)p[i]);
            break;
        case E_F64:
            x = PyFloat_FromDouble(rd_f64(p + 8 * (size_t)i));
            break;
        default:
            x = PyBool_FromLong(p[i] != 0);
            break;
        }
        if (x == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, (Py_ssize_t)i, x);
    }
    if (PyObject_GC_IsTracked(t)) PyObject_GC_UnTrack(t);
    return t;
}

/* _Fast.ints: the vector of elements of kind e (size elem) the offset at p points to. */
static PyObject *items(Ctx *c, int64_t p, int elem, int e) {
    int64_t start;
    uint32_t n;
    if (vector(c, p, elem, 1, &start, &n) < 0) return NULL;
    const uint8_t *q = c->b + start;
    if (n == 0 || n > MEMOMAXBYTES / (uint32_t)elem || e == E_F64 || e == E_BOOL) return scalars(q, n, e);
    uint32_t nbytes = n * (uint32_t)elem;
    uint64_t h = UINT64_C(0xCBF29CE484222325) ^ (uint64_t)e;
    for (uint32_t i = 0; i < nbytes; i++) h = (h ^ q[i]) * UINT64_C(0x100000001B3);
    MemoEntry *slot = NULL;
    for (uint32_t k = 0; k < MEMOPROBE; k++) {
        MemoEntry *m = &c->memo[(h + k) & (MEMOCAP - 1)];
        if (m->p == NULL) {
            slot = m;
            break;
        }
        if (m->kind == e && m->nbytes == nbytes && memcmp(m->p, q, nbytes) == 0) return Py_NewRef(m->tuple);
    }
    PyObject *t = scalars(q, n, e);
    if (t != NULL && slot != NULL) {
        slot->p = q;
        slot->nbytes = nbytes;
        slot->kind = e;
        slot->tuple = Py_NewRef(t);
    }
    return t;
}

static PyObject *empty_tuple(void) { return PyTuple_New(0); }

/* -- values ------------------------------------------------------------------------------------ */

static const uint8_t F_UNION[2] = {1, 4};
static const uint8_t F_TENSOR[10] = {1, 4, 4, 4, 1, 4, 4, 1, 1, 4};
static const uint8_t F_ALLOC[3] = {4, 4, 4};
static const uint8_t F_EXTRA[3] = {8, 4, 1};
static const uint8_t F_TWO_I32[2] = {4, 4};
static const uint8_t F_1[1] = {1};
static const uint8_t F_4[1] = {4};
static const uint8_t F_8[1] = {8};

static inline PyObject *opt_i8(const uint8_t *b, int64_t pos, uint32_t o) {
    return PyLong_FromLong(o ? (long)(int8_t)b[pos + o] : 0L);
}

static inline PyObject *opt_i32(const uint8_t *b, int64_t pos, uint32_t o) {
    return PyLong_FromLong(o ? (long)rd_i32(b + pos + o) : 0L);
}

static inline PyObject *opt_u32(const uint8_t *b, int64_t pos, uint32_t o) {
    return PyLong_FromUnsignedLong(o ? (unsigned long)rd_u32(b + pos + o) : 0UL);
}

/* _Fast.tensor */
static PyObject *tensor(Ctx *c, const Tab *t) {
    uint32_t o[10];
    if (layout(c, t, 10, F_TENSOR, o) < 0) return NULL;
    const uint8_t *b = c->b;
    int64_t pos = t->pos;
    PyObject *v[10] = {NULL};
    int i;
    v[2] = o[2] ? items(c, pos + o[2], 4, E_I32) : empty_tuple();
    if (v[2] == NULL) goto fail;
    v[3] = o[3] ? items(c, pos + o[3], 1, E_U8) : empty_tuple();
    if (v[3] == NULL) goto fail;
    if (o[6]) {
        Tab a;
        uint32_t ao[3];
        if (ref(c, pos + o[6], &a) < 0 || layout(c, &a, 3, F_ALLOC, ao) < 0) goto fail;
        v[6] = make3(C_ALLOCATIONDETAILS, opt_u32(b, a.pos, ao[0]), opt_u32(b, a.pos, ao[1]), opt_u32(b, a.pos, ao[2]));
        if (v[6] == NULL) goto fail;
    } else {
        v[6] = Py_NewRef(Py_None);
    }
    if (o[9]) {
        Tab x;
        uint32_t xo[3];
        if (ref(c, pos + o[9], &x) < 0 || layout(c, &x, 3, F_EXTRA, xo) < 0) goto fail;
        PyObject *name = xo[1] ? string(c, x.pos + xo[1]) : Py_NewRef(Py_None);
        if (name == NULL) goto fail;
        v[9] = make3(C_EXTRATENSORINFO,
                     PyLong_FromUnsignedLongLong(xo[0] ? (unsigned long long)rd_u64(b + x.pos + xo[0]) : 0ULL), name,
                     opt_i8(b, x.pos, xo[2]));
        if (v[9] == NULL) goto fail;
    } else {
        v[9] = Py_NewRef(Py_None);
    }
    v[0] = opt_i8(b, pos, o[0]);
    v[1] = opt_i32(b, pos, o[1]);
    v[4] = PyBool_FromLong(o[4] ? b[pos + o[4]] != 0 : 0);
    v[5] = opt_u32(b, pos, o[5]);
    v[7] = opt_i8(b, pos, o[7]);
    v[8] = opt_i8(b, pos, o[8]);
    return make(C_TENSOR, v); /* steals v, also when one of them is NULL */
fail:
    for (i = 0; i < 10; i++) Py_XDECREF(v[i]);
    return NULL;
}

/* _Fast.member without the EValue: the union member of class kind at table t. */
static PyObject *member(Ctx *c, int kind, const Tab *t) {
    const uint8_t *b = c->b;
    uint32_t o;
    switch (kind) {
    case C_TENSOR:
        return tensor(c, t);
    case C_NULL:
        return make(C_NULL, NULL);
    case C_INT:
        if (layout(c, t, 1, F_8, &o) < 0) return NULL;
        return make1(C_INT, PyLong_FromLongLong(o ? (long long)rd_i64(b + t->pos + o) : 0LL));
    case C_BOOL:
        if (layout(c, t, 1, F_1, &o) < 0) return NULL;
        return make1(C_BOOL, PyBool_FromLong(o ? b[t->pos + o] != 0 : 0));
    case C_DOUBLE:
        if (layout(c, t, 1, F_8, &o) < 0) return NULL;
        return make1(C_DOUBLE, PyFloat_FromDouble(o ? rd_f64(b + t->pos + o) : 0.0));
    default:
        break;
    }
    if (layout(c, t, 1, F_4, &o) < 0) return NULL;
    int64_t p = t->pos + o;
    PyObject *x;
    switch (kind) {
    case C_STRING:
        x = o ? string(c, p) : Py_NewRef(Py_None);
        break;
    case C_INTLIST:
        x = o ? items(c, p, 8, E_I64) : empty_tuple();
        break;
    case C_DOUBLELIST:
        x = o ? items(c, p, 8, E_F64) : empty_tuple();
        break;
    case C_BOOLLIST:
        x = o ? items(c, p, 1, E_BOOL) : empty_tuple();
        break;
    default: /* C_TENSORLIST, C_OPTIONALTENSORLIST */
        x = o ? items(c, p, 4, E_I32) : empty_tuple();
        break;
    }
    return make1(kind, x);
}

/* One EValue (the loop body of _Fast.evalues). */
static PyObject *evalue(Ctx *c, int64_t pos) {
    Tab t, v;
    uint32_t o[2];
    if (table(c, pos, &t) < 0 || layout(c, &t, 2, F_UNION, o) < 0) return NULL;
    uint32_t tag = o[0] ? c->b[pos + o[0]] : 0;
    if (tag == 0) return make1(C_EVALUE, Py_NewRef(Py_None));
    if (tag > (uint32_t)nkernel || !o[1]) return NULL;
    if (ref(c, pos + o[1], &v) < 0) return NULL;
    return make1(C_EVALUE, member(c, kernel_kind[tag - 1], &v));
}

/* One Instruction (the loop body of _Fast.instructions). */
static PyObject *instruction(Ctx *c, int64_t pos) {
    Tab t, v;
    uint32_t o[2];
    if (table(c, pos, &t) < 0 || layout(c, &t, 2, F_UNION, o) < 0) return NULL;
    uint32_t tag = o[0] ? c->b[pos + o[0]] : 0;
    if (tag == 0 || tag > (uint32_t)ninstr || !o[1]) return NULL;
    if (ref(c, pos + o[1], &v) < 0) return NULL;
    const uint8_t *b = c->b;
    int kind = instr_kind[tag - 1];
    PyObject *args;
    if (kind == C_FREECALL) {
        if (layout(c, &v, 1, F_4, o) < 0) return NULL;
        args = make1(C_FREECALL, opt_i32(b, v.pos, o[0]));
    } else {
        if (layout(c, &v, 2, F_TWO_I32, o) < 0) return NULL;
        if (kind == C_KERNELCALL || kind == C_DELEGATECALL) {
            PyObject *list = o[1] ? items(c, v.pos + o[1], 4, E_I32) : empty_tuple();
            if (list == NULL) return NULL;
            args = make2(kind, opt_i32(b, v.pos, o[0]), list);
        } else { /* C_MOVECALL, C_JUMPFALSECALL */
            args = make2(kind, opt_i32(b, v.pos, o[0]), opt_i32(b, v.pos, o[1]));
        }
    }
    return make1(C_INSTRUCTION, args);
}

/* -- entry points ------------------------------------------------------------------------------ */

static PyObject *decode(PyObject *args, PyObject *(*one)(Ctx *, int64_t)) {
    PyObject *obj;
    Py_ssize_t end, start, n;
    if (!PyArg_ParseTuple(args, "Onnn", &obj, &end, &start, &n)) return NULL;
    if (!ready) {
        PyErr_SetString(PyExc_RuntimeError, "orchestra.program._decode.setup() has not been called");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL;
    Ctx *c = NULL;
    int gc_was_enabled = 0;
    if (end < 0 || end > view.len || start < 0 || n < 0 || (int64_t)start + 4 * (int64_t)n > (int64_t)end) {
        result = Py_NewRef(Py_None); /* struct.unpack_from would fail, or more than the Python checks */
        goto done;
    }
    c = PyMem_Malloc(sizeof *c);
    if (c == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    c->b = (const uint8_t *)view.buf;
    c->end = (int64_t)end;
    c->spent = 0;
    for (int k = 0; k < VTCAP; k++) c->vts[k].vt = -1;
    memset(c->memo, 0, sizeof c->memo);
    /* No garbage collection while this builds thousands of tracked objects (they hold no
     * cycles); the collections it defers run at the next allocation once it is enabled again. */
    gc_was_enabled = PyGC_Disable();
    PyObject *out = PyTuple_New(n);
    if (out == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t p = (int64_t)start + 4 * (int64_t)i;
        PyObject *x = one(c, p + (int64_t)rd_u32(c->b + p));
        if (x == NULL) {
            Py_DECREF(out);
            if (!PyErr_Occurred()) result = Py_NewRef(Py_None); /* fall back */
            goto done;
        }
        PyTuple_SET_ITEM(out, i, x);
    }
    PyObject_GC_UnTrack(out); /* every item is untracked (see the top) */
    PyObject *spent = PyLong_FromLongLong((long long)c->spent);
    result = spent == NULL ? NULL : PyTuple_New(2);
    if (result == NULL) {
        Py_DECREF(out);
        Py_XDECREF(spent);
        goto done;
    }
    PyTuple_SET_ITEM(result, 0, out);
    PyTuple_SET_ITEM(result, 1, spent);
done:
    if (c != NULL) {
        for (int k = 0; k < MEMOCAP; k++) Py_XDECREF(c->memo[k].tuple);
        PyMem_Free(c);
    }
    if (gc_was_enabled) PyGC_Enable();
    PyBuffer_Release(&view);
    return result;
}

PyDoc_STRVAR(evalues_doc,
             "evalues(buf, end, start, n) -> (tuple of EValue, objects spent) | None\n\n"
             "_Fast.evalues(start, n) of the flatbuffer buf[0:end]; None where it raises.");

static PyObject *evalues(PyObject *Py_UNUSED(self), PyObject *args) { return decode(args, evalue); }

PyDoc_STRVAR(instructions_doc,
             "instructions(buf, end, start, n) -> (tuple of Instruction, objects spent) | None\n\n"
             "_Fast.instructions(start, n) of the flatbuffer buf[0:end]; None where it raises.");

static PyObject *instructions(PyObject *Py_UNUSED(self), PyObject *args) { return decode(args, instruction); }

/* A DataSegment table: (offset, size), 0 where absent (_fast_fields with _SEGMENT_LAYOUT). */
static PyObject *segment(Ctx *c, int64_t pos) {
    static const uint8_t sizes[2] = {8, 8};
    Tab t;
    uint32_t o[2];
    if (table(c, pos, &t) < 0 || layout(c, &t, 2, sizes, o) < 0) return NULL;
    const uint64_t off = o[0] ? rd_u64(c->b + pos + o[0]) : 0, size = o[1] ? rd_u64(c->b + pos + o[1]) : 0;
    return Py_BuildValue("(KK)", (unsigned long long)off, (unsigned long long)size);
}

/* A NamedData table: (key, segment_index), the index 0 where absent; no key falls back
 * (_loads' fast path with _NAMED_DATA_LAYOUT). */
static PyObject *named(Ctx *c, int64_t pos) {
    static const uint8_t sizes[2] = {4, 4};
    Tab t;
    uint32_t o[2];
    if (table(c, pos, &t) < 0 || layout(c, &t, 2, sizes, o) < 0 || !o[0]) return NULL;
    PyObject *key = string(c, pos + o[0]);
    if (key == NULL) return NULL;
    return Py_BuildValue("(Nk)", key, (unsigned long)(o[1] ? rd_u32(c->b + pos + o[1]) : 0));
}

/* An Operator table: (name, overload), the overload "" where absent; no name falls back
 * (_Fast.operators). */
static PyObject *operator_pair(Ctx *c, int64_t pos) {
    static const uint8_t sizes[2] = {4, 4};
    Tab t;
    uint32_t o[2];
    if (table(c, pos, &t) < 0 || layout(c, &t, 2, sizes, o) < 0 || !o[0]) return NULL;
    PyObject *name = string(c, pos + o[0]);
    if (name == NULL) return NULL;
    PyObject *overload = o[1] ? string(c, pos + o[1]) : PyUnicode_FromStringAndSize("", 0);
    if (overload == NULL) {
        Py_DECREF(name);
        return NULL;
    }
    return Py_BuildValue("(NN)", name, overload);
}

PyDoc_STRVAR(segments_doc,
             "segments(buf, end, start, n) -> (tuple of (offset, size), objects spent) | None\n\n"
             "The program's DataSegment tables of a vector of n offsets at start, as _loads' fast path reads them.");

static PyObject *segments(PyObject *Py_UNUSED(self), PyObject *args) { return decode(args, segment); }

PyDoc_STRVAR(named_data_doc,
             "named_data(buf, end, start, n) -> (tuple of (key, segment_index), objects spent) | None\n\n"
             "The program's NamedData tables of a vector of n offsets at start, as _loads' fast path reads them.");

static PyObject *named_data(PyObject *Py_UNUSED(self), PyObject *args) { return decode(args, named); }

PyDoc_STRVAR(operators_doc,
             "operators(buf, end, start, n) -> (tuple of (name, overload), objects spent) | None\n\n"
             "_Fast.operators(start, n) of the flatbuffer buf[0:end]; None where it raises.");

static PyObject *operators(PyObject *Py_UNUSED(self), PyObject *args) { return decode(args, operator_pair); }

/* -- the verifier's fast paths (_verify_plan) ------------------------------------------------------
 *
 * plain_values and plain_instructions make the checks _verify_plan makes of every value and
 * instruction of a plan that is well formed (_plain_tensor_ok, the TensorList item range, the
 * KernelCall and FreeCall index ranges) on the decoded objects, and return the indices of those
 * they do not vouch for: _verify_plan takes only those through its Python checks, which name
 * what is wrong. So vouching must be exact where it says yes (everything the Python fast path
 * accepts would pass the full checks too, with no side effect) and may be timid: anything
 * unexpected (another class, a field that is not an int, a number past what the arithmetic
 * here holds) is left to Python. They read the objects, not the bytes, so they check what
 * either decoder built, and they allocate nothing sized by the file but the list returned. */

/* Field slot i of an instance of class k (NULL when it was never set). */
static inline PyObject *slot_of(PyObject *o, int k, int i) { return *(PyObject **)((char *)o + classes[k].offset[i]); }

/* *v = the int o when it is exactly an int in [lo, hi]; -1 otherwise (no error left set). */
static inline int int_in(PyObject *o, long long lo, long long hi, long long *v) {
    if (o == NULL || !PyLong_CheckExact(o)) return -1;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    if (x < lo || x > hi) return -1;
    *v = x;
    return 0;
}

#define U32_MAX_LL 0xFFFFFFFFLL
/* A numel past this is left to Python: numel * itemsize (<= 8 bytes) then fits in 63 bits. */
#define NUMEL_HELD (INT64_C(1) << 56)

/* The constants a plan's tensors may refer to: constant_data(i) is either constants[i] bytes
 * long (seglen < 0: the legacy constant_buffer, lengths given) or the slice of a segment of
 * seglen bytes that ProgramDef.constant_data cuts at constants[i] (the constant_segment's
 * offsets). */
typedef struct {
    PyObject *constants; /* tuple */
    long long seglen;
} Consts;

/* *len = len(prog.constant_data(i)) for 0 <= i < len(constants); -1 where not understood. */
static int const_len(const Consts *k, Py_ssize_t i, long long *len) {
    long long start, nxt;
    if (k->seglen < 0) return int_in(PyTuple_GET_ITEM(k->constants, i), 0, LLONG_MAX, len);
    if (int_in(PyTuple_GET_ITEM(k->constants, i), 0, LLONG_MAX, &start) < 0) return -1;
    long long end = k->seglen; /* seg[start:end] with end the next offset when it does not precede start */
    if (i + 1 < PyTuple_GET_SIZE(k->constants)) {
        if (int_in(PyTuple_GET_ITEM(k->constants, i + 1), 0, LLONG_MAX, &nxt) < 0) return -1;
        if (nxt >= start) end = nxt;
    }
    if (start > k->seglen) start = k->seglen; /* a memoryview slice clamps both ends */
    if (end > k->seglen) end = k->seglen;
    *len = end > start ? end - start : 0;
    return 0;
}

/* _plain_tensor_ok(t, ...) is True (1), or this does not vouch for it (0). */
static int plain_tensor(PyObject *t, PyObject *arenas, int capped, long long max_numel,
                        const unsigned char *itemsizes, Py_ssize_t nitemsizes, const Consts *k) {
    long long st, x, idx;
    if (slot_of(t, C_TENSOR, 9) != Py_None) return 0; /* extra_tensor_info */
    if (int_in(slot_of(t, C_TENSOR, 1), 0, 0, &x) < 0) return 0; /* storage_offset */
    if (int_in(slot_of(t, C_TENSOR, 8), 0, 2, &x) < 0) return 0; /* shape_dynamism */
    if (int_in(slot_of(t, C_TENSOR, 0), 0, (long long)nitemsizes - 1, &st) < 0 || itemsizes[st] == 0) return 0;
    PyObject *sizes = slot_of(t, C_TENSOR, 2), *d = slot_of(t, C_TENSOR, 3);
    if (sizes == NULL || !PyTuple_CheckExact(sizes) || d == NULL || !PyTuple_CheckExact(d)) return 0;
    Py_ssize_t ndim = PyTuple_GET_SIZE(sizes), nd = PyTuple_GET_SIZE(d);
    if (nd) { /* a permutation of range(ndim) */
        unsigned char seen[256];
        if (nd != ndim || nd > 256) return 0;
        memset(seen, 0, (size_t)nd);
        for (Py_ssize_t j = 0; j < nd; j++) {
            if (int_in(PyTuple_GET_ITEM(d, j), 0, (long long)nd - 1, &x) < 0 || seen[x]) return 0;
            seen[x] = 1;
        }
    }
    /* numel; past NUMEL_HELD it is left to Python, unless a later size is 0 */
    long long numel = 1;
    int big = 0, zero = 0;
    for (Py_ssize_t j = 0; j < ndim; j++) {
        if (int_in(PyTuple_GET_ITEM(sizes, j), 0, LLONG_MAX, &x) < 0) return 0; /* negative: Python names it */
        if (x == 0) zero = 1;
        else if (!big && x > NUMEL_HELD / numel) big = 1;
        else if (!big) numel *= x;
    }
    if (zero) numel = 0;
    else if (big) return 0;
    if (capped && numel > max_numel) return 0;
    long long nbytes = numel * (long long)itemsizes[st];
    if (int_in(slot_of(t, C_TENSOR, 5), 0, LLONG_MAX, &idx) < 0) return 0; /* data_buffer_idx */
    PyObject *a = slot_of(t, C_TENSOR, 6);
    if (a == NULL) return 0;
    if (a != Py_None) { /* planned: in an arena, no initial data */
        long long mid, lo, hi, size;
        if (!Py_IS_TYPE(a, classes[C_ALLOCATIONDETAILS].type) || idx != 0) return 0;
        if (int_in(slot_of(a, C_ALLOCATIONDETAILS, 0), 1, (long long)PyTuple_GET_SIZE(arenas) - 1, &mid) < 0) return 0;
        if (int_in(slot_of(a, C_ALLOCATIONDETAILS, 1), 0, U32_MAX_LL, &lo) < 0 ||
            int_in(slot_of(a, C_ALLOCATIONDETAILS, 2), 0, U32_MAX_LL, &hi) < 0)
            return 0;
        if (int_in(PyTuple_GET_ITEM(arenas, mid), 0, LLONG_MAX, &size) < 0) return 0;
        uint64_t offset = (uint64_t)hi << 32 | (uint64_t)lo;
        return offset <= (uint64_t)size && (uint64_t)nbytes <= (uint64_t)size - offset;
    }
    if (idx == 0) return 1; /* no data: an input, or memory the runtime provides */
    long long avail;
    if (idx >= PyTuple_GET_SIZE(k->constants) || const_len(k, (Py_ssize_t)idx, &avail) < 0) return 0;
    return nbytes <= avail;
}

/* Appends index i to the list todo (of indices for Python to look at). */
static int append_index(PyObject *todo, Py_ssize_t i) {
    PyObject *x = PyLong_FromSsize_t(i);
    if (x == NULL) return -1;
    int r = PyList_Append(todo, x);
    Py_DECREF(x);
    return r;
}

PyDoc_STRVAR(plain_values_doc,
             "plain_values(values, arenas, max_numel, itemsizes, constants, segment_len) -> list of int\n\n"
             "The indices of the values of a plan (a tuple of EValue) that _verify_plan must check in Python:\n"
             "every other one is a tensor _plain_tensor_ok accepts, a (Optional)TensorList whose items are value\n"
             "indices (or -1) in range, or a value with nothing to check. arenas: the plan's\n"
             "non_const_buffer_sizes; max_numel: Limits.max_numel (None: no cap); itemsizes: bytes, the item size\n"
             "of each scalar type by its number (0: not a type); constants: the byte lengths of the constant_buffer\n"
             "(segment_len None) or the constant_segment's offsets into a segment of segment_len bytes.");

static PyObject *plain_values(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *values, *arenas, *cap, *itemsizes, *constants, *seglen_obj;
    if (!PyArg_ParseTuple(args, "O!O!OO!O!O", &PyTuple_Type, &values, &PyTuple_Type, &arenas, &cap, &PyBytes_Type,
                          &itemsizes, &PyTuple_Type, &constants, &seglen_obj))
        return NULL;
    if (!ready) {
        PyErr_SetString(PyExc_RuntimeError, "orchestra.program._decode.setup() has not been called");
        return NULL;
    }
    int capped = cap != Py_None;
    long long max_numel = 0;
    if (capped) {
        int overflow;
        if (!PyLong_Check(cap)) {
            PyErr_SetString(PyExc_TypeError, "max_numel must be an int or None");
            return NULL;
        }
        max_numel = PyLong_AsLongLongAndOverflow(cap, &overflow);
        if (max_numel == -1 && PyErr_Occurred()) return NULL;
        if (overflow) max_numel = overflow > 0 ? LLONG_MAX : -1; /* numel here is below 2**56 */
    }
    Consts k = {constants, -1};
    if (seglen_obj != Py_None && int_in(seglen_obj, 0, LLONG_MAX, &k.seglen) < 0) {
        PyErr_SetString(PyExc_ValueError, "segment_len must be None or a non-negative int");
        return NULL;
    }
    const unsigned char *sizes = (const unsigned char *)PyBytes_AS_STRING(itemsizes);
    Py_ssize_t nsizes = PyBytes_GET_SIZE(itemsizes);
    Py_ssize_t nv = PyTuple_GET_SIZE(values);
    PyObject *todo = PyList_New(0);
    if (todo == NULL) return NULL;
    for (Py_ssize_t i = 0; i < nv; i++) {
        PyObject *ev = PyTuple_GET_ITEM(values, i);
        int ok = 0;
        PyObject *v = Py_IS_TYPE(ev, classes[C_EVALUE].type) ? slot_of(ev, C_EVALUE, 0) : NULL;
        PyTypeObject *type = v == NULL ? NULL : Py_TYPE(v);
        if (type == NULL) {
            ok = 0;
        } else if (type == classes[C_TENSOR].type) {
            ok = plain_tensor(v, arenas, capped, max_numel, sizes, nsizes, &k);
        } else if (type == classes[C_TENSORLIST].type || type == classes[C_OPTIONALTENSORLIST].type) {
            int kind = type == classes[C_TENSORLIST].type ? C_TENSORLIST : C_OPTIONALTENSORLIST;
            PyObject *items = slot_of(v, kind, 0);
            long long lo = kind == C_OPTIONALTENSORLIST ? -1 : 0, x;
            ok = items != NULL && PyTuple_CheckExact(items);
            for (Py_ssize_t j = 0; ok && j < PyTuple_GET_SIZE(items); j++) {
                ok = int_in(PyTuple_GET_ITEM(items, j), lo, (long long)nv - 1, &x) == 0;
            }
        } else { /* nothing to check (IntList items are literal ints or SymInt indices, checked when used) */
            ok = v == Py_None || type == classes[C_NULL].type || type == classes[C_INT].type ||
                 type == classes[C_BOOL].type || type == classes[C_DOUBLE].type || type == classes[C_STRING].type ||
                 type == classes[C_INTLIST].type || type == classes[C_DOUBLELIST].type ||
                 type == classes[C_BOOLLIST].type;
        }
        if (!ok && append_index(todo, i) < 0) {
            Py_DECREF(todo);
            return NULL;
        }
    }
    return todo;
}

PyDoc_STRVAR(plain_instructions_doc,
             "plain_instructions(instructions, nv, nops, ndel) -> list of int\n\n"
             "The indices of the instructions of a chain (a tuple of Instruction) that _verify_plan must check in\n"
             "Python: every other one passes its checks there (value indices below nv, operator indices below\n"
             "nops, delegate indices below ndel, none negative; a jump's destination within the chain).");

static PyObject *plain_instructions(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *ins;
    Py_ssize_t nv, nops, ndel;
    if (!PyArg_ParseTuple(args, "O!nnn", &PyTuple_Type, &ins, &nv, &nops, &ndel)) return NULL;
    if (!ready) {
        PyErr_SetString(PyExc_RuntimeError, "orchestra.program._decode.setup() has not been called");
        return NULL;
    }
    PyObject *todo = PyList_New(0);
    if (todo == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ins); i++) {
        PyObject *in = PyTuple_GET_ITEM(ins, i);
        PyObject *a = Py_IS_TYPE(in, classes[C_INSTRUCTION].type) ? slot_of(in, C_INSTRUCTION, 0) : NULL;
        long long x;
        int ok = 0;
        if (a == NULL) {
            ok = 0;
        } else if (Py_IS_TYPE(a, classes[C_KERNELCALL].type) || Py_IS_TYPE(a, classes[C_DELEGATECALL].type)) {
            int kind = Py_IS_TYPE(a, classes[C_KERNELCALL].type) ? C_KERNELCALL : C_DELEGATECALL;
            PyObject *list = slot_of(a, kind, 1);
            ok = int_in(slot_of(a, kind, 0), 0, (long long)(kind == C_KERNELCALL ? nops : ndel) - 1, &x) == 0 &&
                 list != NULL && PyTuple_CheckExact(list);
            for (Py_ssize_t j = 0; ok && j < PyTuple_GET_SIZE(list); j++) {
                ok = int_in(PyTuple_GET_ITEM(list, j), 0, (long long)nv - 1, &x) == 0;
            }
        } else if (Py_IS_TYPE(a, classes[C_FREECALL].type)) {
            ok = int_in(slot_of(a, C_FREECALL, 0), 0, (long long)nv - 1, &x) == 0;
        } else if (Py_IS_TYPE(a, classes[C_MOVECALL].type)) {
            ok = int_in(slot_of(a, C_MOVECALL, 0), 0, (long long)nv - 1, &x) == 0 &&
                 int_in(slot_of(a, C_MOVECALL, 1), 0, (long long)nv - 1, &x) == 0;
        } else if (Py_IS_TYPE(a, classes[C_JUMPFALSECALL].type)) {
            ok = int_in(slot_of(a, C_JUMPFALSECALL, 0), 0, (long long)nv - 1, &x) == 0 &&
                 int_in(slot_of(a, C_JUMPFALSECALL, 1), 0, (long long)PyTuple_GET_SIZE(ins), &x) == 0;
        }
        if (!ok && append_index(todo, i) < 0) {
            Py_DECREF(todo);
            return NULL;
        }
    }
    return todo;
}

PyDoc_STRVAR(extra_info_values_doc,
             "extra_info_values(values) -> list of int\n\n"
             "The indices of the values (a tuple of EValue) that may be tensors with extra_tensor_info, in order:\n"
             "exactly those among the schema's objects, and every value that is not one of them (the caller checks\n"
             "each index it gets).");

static PyObject *extra_info_values(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *values;
    if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &values)) return NULL;
    if (!ready) {
        PyErr_SetString(PyExc_RuntimeError, "orchestra.program._decode.setup() has not been called");
        return NULL;
    }
    PyObject *found = PyList_New(0);
    if (found == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(values); i++) {
        PyObject *ev = PyTuple_GET_ITEM(values, i);
        PyObject *v = Py_IS_TYPE(ev, classes[C_EVALUE].type) ? slot_of(ev, C_EVALUE, 0) : NULL;
        int maybe = 1;
        if (v == Py_None) {
            maybe = 0;
        } else if (v != NULL && Py_IS_TYPE(v, classes[C_TENSOR].type)) {
            maybe = slot_of(v, C_TENSOR, 9) != Py_None;
        } else if (v != NULL) {
            for (int k = C_NULL; k <= C_OPTIONALTENSORLIST; k++) {
                if (k != C_TENSOR && Py_IS_TYPE(v, classes[k].type)) maybe = 0;
            }
        }
        if (maybe && append_index(found, i) < 0) {
            Py_DECREF(found);
            return NULL;
        }
    }
    return found;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, setup_doc},
    {"evalues", evalues, METH_VARARGS, evalues_doc},
    {"instructions", instructions, METH_VARARGS, instructions_doc},
    {"segments", segments, METH_VARARGS, segments_doc},
    {"named_data", named_data, METH_VARARGS, named_data_doc},
    {"operators", operators, METH_VARARGS, operators_doc},
    {"plain_values", plain_values, METH_VARARGS, plain_values_doc},
    {"plain_instructions", plain_instructions, METH_VARARGS, plain_instructions_doc},
    {"extra_info_values", extra_info_values, METH_VARARGS, extra_info_values_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "orchestra.program._decode",
    .m_doc = "C decoding of an ExecuTorch program's values and instructions (orchestra.program._reader._Fast).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__decode(void) { return PyModule_Create(&module); }
