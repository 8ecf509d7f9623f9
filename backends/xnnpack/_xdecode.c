/* orchestra.backends.xnnpack._xdecode: _Fast.value / _Fast.node / _Fast.constant of
 * backends/xnnpack/_blob.py over a whole XNNGraph, in C (optional; the Python code is the
 * reference and the fallback).
 *
 * graph(buf, end, root, budget, layouts, makers) decodes the graph's xvalues then its xnodes;
 * constants(buf, end, root, budget, section) its constant_data; blob(buf, budget, layouts, makers,
 * constant_maker) a whole blob with an XH00 header (parse_blob's header checks, the identifier, the root,
 * version, both vectors, num_externs, the ids and the constants) in one call. Each makes exactly the checks
 * the Python fast path makes (table, vtable and field bounds and alignment, offsets, vector
 * bounds, union tags, dims, null-terminated strict UTF-8 keys, constant ranges) and charges
 * the same object budget (one per table, one per vector element, one per string), and
 * returns, with the objects spent:
 *   graph     -> ((XValue, ...), (XNode, ...), spent), built through the classes' slots from
 *     value  = (id_out, datatype, dims, constant_buffer_idx, external_id, flags, dq_datatype, quant)
 *     quant  = None | (tag, scales, zero_point, channel_dim, scale_buffer_idx, num_scales)
 *              (tag 1 PerChannelQuant, 2 PerTensorQuant)
 *     node   = (tag, field values in layout order, debug_handle, None | (output_min, output_max))
 *   constants -> (((offset, size, named_key or None), ...), spent), plain tuples
 * or None wherever the Python fast path would raise _Fallback: the caller then decodes the
 * graph on the checked path, whose error names the place. Nothing is read outside buf[0:end].
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define MAX_DIMS 6 /* XNNPACK's XNN_MAX_TENSOR_DIMS (_blob.MAX_DIMS) */
#define MAX_LAYOUTS 128

typedef struct {
    const uint8_t *b;
    uint64_t end;
    int64_t budget; /* objects left before the call */
    int64_t spent;
} R;

typedef struct {
    uint64_t pos, objsize, vt;
    uint32_t nfields;
} T;

static inline uint16_t u16(const R *r, uint64_t p) {
    uint16_t v;
    memcpy(&v, r->b + p, 2);
    return v;
}
static inline uint32_t u32(const R *r, uint64_t p) {
    uint32_t v;
    memcpy(&v, r->b + p, 4);
    return v;
}

static inline int charge(R *r, uint64_t n) {
    r->spent += (int64_t)n;
    return r->spent > r->budget ? -1 : 0;
}

/* _Fast.table: 0, or -1 where it raises _Fallback. */
static int table(R *r, uint64_t pos, T *t, int charged) {
    if (charged && charge(r, 1) < 0) return -1;
    if (pos > r->end || r->end - pos < 4 || (pos & 3)) return -1;
    int32_t off;
    memcpy(&off, r->b + pos, 4);
    int64_t vt = (int64_t)pos - (int64_t)off;
    if (vt < 0 || (uint64_t)vt + 4 > r->end || (vt & 1)) return -1;
    uint32_t vtsize = u16(r, (uint64_t)vt), objsize = u16(r, (uint64_t)vt + 2);
    if (vtsize < 4 || (vtsize & 1) || (uint64_t)vt + vtsize > r->end || objsize < 4 || pos + objsize > r->end)
        return -1;
    t->pos = pos;
    t->objsize = objsize;
    t->vt = (uint64_t)vt;
    t->nfields = (vtsize - 4) >> 1;
    return 0;
}

/* _Fast.field: the field's position, 0 when absent, -1 when it lies outside its table. */
static int64_t field(const R *r, const T *t, uint32_t slot, uint32_t size) {
    uint32_t o = slot < t->nfields ? u16(r, t->vt + 4 + 2 * (uint64_t)slot) : 0;
    if (o == 0) return 0;
    if (o < 4 || o + size > t->objsize) return -1;
    return (int64_t)(t->pos + o);
}

/* _Fast.ref */
static int64_t ref(const R *r, uint64_t p) {
    uint64_t target = p + u32(r, p);
    return target + 4 > r->end ? -1 : (int64_t)target;
}

/* _Fast.vector: (start, n) of a vector of 4-byte elements, n = 0 when absent; charged. */
static int vector(R *r, const T *t, uint32_t slot, uint64_t *start, uint64_t *n) {
    int64_t p = field(r, t, slot, 4);
    if (p < 0) return -1;
    *start = 0;
    *n = 0;
    if (p == 0) return 0;
    int64_t v = ref(r, (uint64_t)p);
    if (v < 0) return -1;
    uint64_t len = u32(r, (uint64_t)v);
    if ((v & 3) || (uint64_t)v + 4 + 4 * len > r->end) return -1;
    if (charge(r, len) < 0) return -1;
    *start = (uint64_t)v + 4;
    *n = len;
    return 0;
}

/* _Fast.union: the tag (0: none) and, for a tag, the member's table (*has = 0 when absent). */
static int union_(R *r, const T *t, uint32_t slot, uint32_t *tag, T *member, int *has) {
    int64_t p = field(r, t, slot, 1);
    if (p < 0) return -1;
    *tag = p ? r->b[p] : 0;
    *has = 0;
    if (*tag == 0) return 0;
    p = field(r, t, slot + 1, 4);
    if (p < 0) return -1;
    if (p == 0) return 0;
    int64_t target = ref(r, (uint64_t)p);
    if (target < 0 || table(r, (uint64_t)target, member, 1) < 0) return -1;
    *has = 1;
    return 0;
}

/* A scalar field of ``size`` bytes (its raw bits, 0 when absent). */
static int scalar(const R *r, const T *t, uint32_t slot, uint32_t size, uint64_t *out) {
    int64_t p = field(r, t, slot, size);
    if (p < 0) return -1;
    *out = 0;
    if (p) memcpy(out, r->b + p, size); /* little-endian hosts only (setup.py builds it there) */
    return 0;
}

static PyObject *f32_obj(uint64_t bits) {
    uint32_t w = (uint32_t)bits;
    float f;
    memcpy(&f, &w, 4);
    return PyFloat_FromDouble((double)f);
}

static PyObject *i32_obj(uint64_t bits) { return PyLong_FromLong((long)(int32_t)(uint32_t)bits); }

static PyObject *i16_obj(uint64_t bits) { return PyLong_FromLong((long)(int16_t)(uint16_t)bits); }

/* A [uint32] vector field as a tuple of ints; NULL with *bad = 1 where the fast path falls back. */
static PyObject *u32_tuple(R *r, const T *t, uint32_t slot, int *bad) {
    uint64_t start, n;
    if (vector(r, t, slot, &start, &n) < 0) {
        *bad = 1;
        return NULL;
    }
    PyObject *tup = PyTuple_New((Py_ssize_t)n);
    if (!tup) return NULL;
    for (uint64_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLong(u32(r, start + 4 * i));
        if (!v) {
            Py_DECREF(tup);
            return NULL;
        }
        PyTuple_SET_ITEM(tup, (Py_ssize_t)i, v);
    }
    return tup;
}

#define FALLBACK()      \
    do {                \
        *bad = 1;       \
        goto fail;      \
    } while (0)
#define FALLBACK_NULL() \
    do {                \
        *bad = 1;       \
        return NULL;    \
    } while (0)

/* _Fast.value */
static PyObject *value(R *r, uint64_t pos, int *bad) {
    PyObject *quant = NULL, *dims = NULL, *scales = NULL;
    T t, v, q;
    uint32_t tag, qtag;
    int has;
    if (table(r, pos, &t, 1) < 0 || union_(r, &t, 0, &tag, &v, &has) < 0 || !has || (tag != 1 && tag != 2))
        FALLBACK();
    if (tag == 2) { /* XNNQuantizedTensorValue: its parameters, then its tensor_value */
        if (union_(r, &v, 1, &qtag, &q, &has) < 0) FALLBACK();
        if (qtag) {
            if (!has || qtag > 2) FALLBACK();
            uint64_t zp = 0, cd = 0, sbi = 0, ns = 0;
            if (qtag == 2) { /* PerTensorQuant: scale, zero_point */
                uint64_t sc;
                if (scalar(r, &q, 0, 4, &sc) < 0 || scalar(r, &q, 1, 4, &zp) < 0) FALLBACK();
                PyObject *s = f32_obj(sc);
                if (!s) goto fail;
                scales = PyTuple_Pack(1, s);
                Py_DECREF(s);
                if (!scales) goto fail;
            } else { /* PerChannelQuant: scale (floats), channel_dim, scale_buffer_idx, num_scales */
                uint64_t start, n;
                if (vector(r, &q, 0, &start, &n) < 0) FALLBACK();
                scales = PyTuple_New((Py_ssize_t)n);
                if (!scales) goto fail;
                for (uint64_t i = 0; i < n; i++) {
                    PyObject *s = f32_obj(u32(r, start + 4 * i));
                    if (!s) goto fail;
                    PyTuple_SET_ITEM(scales, (Py_ssize_t)i, s);
                }
                if (scalar(r, &q, 1, 4, &cd) < 0 || scalar(r, &q, 2, 4, &sbi) < 0 || scalar(r, &q, 3, 4, &ns) < 0)
                    FALLBACK();
            }
            quant = Py_BuildValue("(INNNkk)", (unsigned int)qtag, scales, i32_obj(zp), i32_obj(cd),
                                  (unsigned long)(uint32_t)sbi, (unsigned long)(uint32_t)ns);
            scales = NULL; /* stolen by N */
            if (!quant) goto fail;
        }
        int64_t p = field(r, &v, 0, 4);
        if (p <= 0) FALLBACK();
        int64_t target = ref(r, (uint64_t)p);
        T tv;
        if (target < 0 || table(r, (uint64_t)target, &tv, 1) < 0) FALLBACK();
        v = tv;
    }
    /* XNNTensorValue: datatype, num_dims, dims, constant_buffer_idx, external_id, flags, id_out, dq_datatype */
    uint64_t datatype, num_dims, cbi, ext, flags, id_out, dq;
    if (scalar(r, &v, 0, 2, &datatype) < 0 || scalar(r, &v, 1, 4, &num_dims) < 0) FALLBACK();
    dims = u32_tuple(r, &v, 2, bad);
    if (!dims) goto fail;
    if (scalar(r, &v, 3, 4, &cbi) < 0 || scalar(r, &v, 4, 4, &ext) < 0 || scalar(r, &v, 5, 4, &flags) < 0 ||
        scalar(r, &v, 6, 4, &id_out) < 0 || scalar(r, &v, 7, 2, &dq) < 0)
        FALLBACK();
    if ((uint64_t)PyTuple_GET_SIZE(dims) != num_dims || PyTuple_GET_SIZE(dims) > MAX_DIMS) FALLBACK();
    if (!quant) {
        quant = Py_None;
        Py_INCREF(quant);
    }
    return Py_BuildValue("(kNNkkkNN)", (unsigned long)id_out, i16_obj(datatype), dims, (unsigned long)cbi,
                         (unsigned long)ext, (unsigned long)flags, i16_obj(dq), quant);
fail:
    Py_XDECREF(quant);
    Py_XDECREF(dims);
    Py_XDECREF(scales);
    return NULL;
}

/* _Fast.node, given the field layouts ("u" uint32, "f" float32, "i" int32, "U" [uint32]) by tag. */
static PyObject *node(R *r, uint64_t pos, const char *const *layouts, Py_ssize_t nlayouts, int *bad) {
    PyObject *fields = NULL, *omm = NULL;
    T t, v;
    uint32_t tag;
    int has;
    if (table(r, pos, &t, 1) < 0 || union_(r, &t, 0, &tag, &v, &has) < 0 || tag == 0 || tag > nlayouts || !has)
        FALLBACK();
    const char *layout = layouts[tag - 1];
    Py_ssize_t nf = (Py_ssize_t)strlen(layout);
    fields = PyTuple_New(nf);
    if (!fields) goto fail;
    for (Py_ssize_t k = 0; k < nf; k++) {
        PyObject *o;
        uint64_t bits;
        if (layout[k] == 'U') {
            o = u32_tuple(r, &v, (uint32_t)k, bad);
        } else {
            if (scalar(r, &v, (uint32_t)k, 4, &bits) < 0) FALLBACK();
            o = layout[k] == 'f' ? f32_obj(bits) : layout[k] == 'i' ? i32_obj(bits)
                                                                    : PyLong_FromUnsignedLong((uint32_t)bits);
        }
        if (!o) goto fail;
        PyTuple_SET_ITEM(fields, k, o);
    }
    int64_t p = field(r, &t, 3, 4);
    if (p < 0) FALLBACK();
    if (p) {
        int64_t target = ref(r, (uint64_t)p);
        T mm;
        uint64_t lo, hi;
        if (target < 0 || table(r, (uint64_t)target, &mm, 1) < 0 || scalar(r, &mm, 0, 4, &lo) < 0 ||
            scalar(r, &mm, 1, 4, &hi) < 0)
            FALLBACK();
        omm = Py_BuildValue("(NN)", f32_obj(lo), f32_obj(hi));
        if (!omm) goto fail;
    } else {
        omm = Py_None;
        Py_INCREF(omm);
    }
    uint64_t dh;
    if (scalar(r, &t, 2, 4, &dh) < 0) FALLBACK();
    return Py_BuildValue("(INkN)", (unsigned int)tag, fields, (unsigned long)dh, omm);
fail:
    Py_XDECREF(fields);
    Py_XDECREF(omm);
    return NULL;
}

/* _Fast.tables: the positions of a vector of tables' elements (each table still to be read). */
static int tables(R *r, const T *t, uint32_t slot, uint64_t *start, uint64_t *n) {
    if (vector(r, t, slot, start, n) < 0) return -1;
    for (uint64_t i = 0; i < *n; i++)
        if (ref(r, *start + 4 * i) < 0) return -1;
    return 0;
}

typedef PyObject *(*ItemFn)(R *, uint64_t, void *, int *);

/* The tuple of items of the table vector at ``slot`` of ``rt``; NULL with *bad or an exception. */
static PyObject *items(R *r, const T *rt, uint32_t slot, ItemFn fn, void *arg, int *bad) {
    uint64_t start, n;
    if (tables(r, rt, slot, &start, &n) < 0) {
        *bad = 1;
        return NULL;
    }
    PyObject *tup = PyTuple_New((Py_ssize_t)n);
    if (!tup) return NULL;
    for (uint64_t i = 0; i < n; i++) {
        PyObject *o = fn(r, (uint64_t)ref(r, start + 4 * i), arg, bad);
        if (!o) {
            Py_DECREF(tup);
            return NULL;
        }
        PyTuple_SET_ITEM(tup, (Py_ssize_t)i, o);
    }
    return tup;
}

typedef struct {
    const char *layouts[MAX_LAYOUTS];
    Py_ssize_t n;
} Layouts;

static PyObject *value_item(R *r, uint64_t pos, void *arg, int *bad) {
    (void)arg;
    return value(r, pos, bad);
}

static PyObject *node_item(R *r, uint64_t pos, void *arg, int *bad) {
    Layouts *l = arg;
    return node(r, pos, l->layouts, l->n, bad);
}

/* _Fast.constant: (offset, size, named_key or None) of one ConstantDataOffset. */
static PyObject *constant_item(R *r, uint64_t pos, void *arg, int *bad) {
    uint64_t section = *(const uint64_t *)arg, off, size;
    T t;
    PyObject *key = NULL;
    if (table(r, pos, &t, 1) < 0 || scalar(r, &t, 0, 8, &off) < 0 || scalar(r, &t, 1, 8, &size) < 0) FALLBACK();
    int64_t p = field(r, &t, 2, 4);
    if (p < 0) FALLBACK();
    if (p) {
        int64_t v = ref(r, (uint64_t)p);
        if (v < 0) FALLBACK();
        uint64_t n = u32(r, (uint64_t)v), start = (uint64_t)v + 4;
        if ((v & 3) || start + n >= r->end || r->b[start + n] != 0 || charge(r, 1) < 0) FALLBACK();
        if (n) {
            key = PyUnicode_DecodeUTF8((const char *)r->b + start, (Py_ssize_t)n, "strict");
            if (!key) {
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) goto fail;
                PyErr_Clear();
                FALLBACK();
            }
        }
    }
    if (!key && (off > section || size > section - off)) FALLBACK();
    if (!key) {
        key = Py_None;
        Py_INCREF(key);
    }
    return Py_BuildValue("(KKN)", (unsigned long long)off, (unsigned long long)size, key);
fail:
    Py_XDECREF(key);
    return NULL;
}

/* Common argument handling: buf, end, root, budget; the root table (already charged). */
static int open_root(PyObject *buf, Py_buffer *view, unsigned long long end, unsigned long long root,
                     long long budget, R *r, T *rt) {
    if (PyObject_GetBuffer(buf, view, PyBUF_SIMPLE) < 0) return -1;
    if (end > (unsigned long long)view->len) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "end runs past the buffer");
        return -1;
    }
    r->b = view->buf;
    r->end = end;
    r->budget = budget;
    r->spent = 0;
    return table(r, root, rt, 0) < 0 ? 1 : 0;
}

/* Instances of a slotted (frozen) dataclass made here: the object allocated, each field stored through its
 * slot's descriptor (as _schema._fast_init's __init__ does, without a Python frame per object). */
#define MAX_FIELDS 12
typedef struct {
    PyTypeObject *cls;
    PyObject *descr[MAX_FIELDS];
    Py_ssize_t n;
} Maker;

static void maker_clear(Maker *m) {
    for (Py_ssize_t i = 0; i < m->n; i++) Py_CLEAR(m->descr[i]);
    m->n = 0;
}

/* cls and the names of its fields, in order; -1 with an exception where a name is not a settable slot */
static int maker_init(Maker *m, PyObject *cls, PyObject *names) {
    m->n = 0;
    if (!PyType_Check(cls) || !PyTuple_Check(names) || PyTuple_GET_SIZE(names) > MAX_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "a maker is (class, (field name, ...))");
        return -1;
    }
    m->cls = (PyTypeObject *)cls;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names); i++) {
        PyObject *d = PyObject_GetAttr(cls, PyTuple_GET_ITEM(names, i));
        if (!d) goto fail;
        m->descr[m->n++] = d;
        if (!Py_TYPE(d)->tp_descr_set) {
            PyErr_SetString(PyExc_TypeError, "a maker's field is not a slot");
            goto fail;
        }
    }
    return 0;
fail:
    maker_clear(m);
    return -1;
}

/* a new instance with the n (== m->n) values given (borrowed) */
static PyObject *make(const Maker *m, PyObject *const *vals) {
    PyObject *o = m->cls->tp_alloc(m->cls, 0);
    if (!o) return NULL;
    for (Py_ssize_t i = 0; i < m->n; i++)
        if (Py_TYPE(m->descr[i])->tp_descr_set(m->descr[i], o, vals[i]) < 0) {
            Py_DECREF(o);
            return NULL;
        }
    return o;
}

/* The decoded values and nodes as XValue / XNode (QuantParams) objects, as _Fast.value and _Fast.node
 * make them, from the tuples value() and node() return: values[i] = (id, datatype, dims, constant_buffer_idx, external_id, flags, dq_datatype,
 * None | (tag, scales, zero_point, channel_dim, scale_buffer_idx, num_scales)), nodes[i] = (tag, fields,
 * debug_handle, output_min_max). kinds: the quantization kind names by tag (1, 2); node_types: (name,
 * field names) by tag. Replaces the items of both tuples in place (new tuples, not shared). */
static int objects(PyObject *values, PyObject *nodes, const Maker *xv, const Maker *xn, const Maker *qp,
                   PyObject *kinds, PyObject *node_types) {
    PyObject *zero = PyLong_FromLong(0);
    if (!zero) return -1;
    int rc = -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(values); i++) {
        PyObject *v = PyTuple_GET_ITEM(values, i), *q = PyTuple_GET_ITEM(v, 7), *quant = Py_None, *index;
        Py_INCREF(quant);
        if (q != Py_None) {
            long tag = PyLong_AsLong(PyTuple_GET_ITEM(q, 0));
            PyObject *qv[8] = {PyTuple_GET_ITEM(kinds, tag - 1), PyTuple_GET_ITEM(q, 1), PyTuple_GET_ITEM(q, 2),
                               PyTuple_GET_ITEM(q, 3), zero, PyTuple_GET_ITEM(q, 4), PyTuple_GET_ITEM(q, 5), zero};
            Py_DECREF(quant);
            quant = make(qp, qv);
            if (!quant) goto done;
        }
        index = PyLong_FromSsize_t(i);
        if (!index) {
            Py_DECREF(quant);
            goto done;
        }
        PyObject *fv[9] = {index, PyTuple_GET_ITEM(v, 0), PyTuple_GET_ITEM(v, 1), PyTuple_GET_ITEM(v, 2),
                           PyTuple_GET_ITEM(v, 3), PyTuple_GET_ITEM(v, 4), PyTuple_GET_ITEM(v, 5),
                           PyTuple_GET_ITEM(v, 6), quant};
        PyObject *o = make(xv, fv);
        Py_DECREF(index);
        Py_DECREF(quant);
        if (!o) goto done;
        PyTuple_SET_ITEM(values, i, o); /* the tuple it replaces is released */
        Py_DECREF(v);
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(nodes); i++) {
        PyObject *nd = PyTuple_GET_ITEM(nodes, i);
        long tag = PyLong_AsLong(PyTuple_GET_ITEM(nd, 0));
        PyObject *type = PyTuple_GET_ITEM(node_types, tag - 1), *names = PyTuple_GET_ITEM(type, 1);
        PyObject *fields = PyTuple_GET_ITEM(nd, 1), *d = PyDict_New(), *index;
        if (!d) goto done;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(fields); k++)
            if (PyDict_SetItem(d, PyTuple_GET_ITEM(names, k), PyTuple_GET_ITEM(fields, k)) < 0) {
                Py_DECREF(d);
                goto done;
            }
        index = PyLong_FromSsize_t(i);
        if (!index) {
            Py_DECREF(d);
            goto done;
        }
        PyObject *fv[5] = {index, PyTuple_GET_ITEM(type, 0), d, PyTuple_GET_ITEM(nd, 2), PyTuple_GET_ITEM(nd, 3)};
        PyObject *o = make(xn, fv);
        Py_DECREF(index);
        Py_DECREF(d);
        if (!o) goto done;
        PyTuple_SET_ITEM(nodes, i, o);
        Py_DECREF(nd);
    }
    rc = 0;
done:
    Py_DECREF(zero);
    return rc;
}

/* graph()'s and blob()'s layouts and makers checked: 0, or -1 with an exception (the makers then cleared) */
static int setup(PyObject *layouts_obj, PyObject *makers, Layouts *l, Maker mk[3], PyObject **kinds,
                 PyObject **node_types) {
    l->n = PyTuple_GET_SIZE(layouts_obj);
    if (l->n > MAX_LAYOUTS) {
        PyErr_SetString(PyExc_ValueError, "too many node layouts");
        return -1;
    }
    for (Py_ssize_t i = 0; i < l->n; i++) {
        l->layouts[i] = PyUnicode_AsUTF8(PyTuple_GET_ITEM(layouts_obj, i));
        if (!l->layouts[i]) return -1;
    }
    static const Py_ssize_t nfields[3] = {9, 5, 8};
    int ok = PyTuple_GET_SIZE(makers) == 5 && PyTuple_Check(*kinds = PyTuple_GET_ITEM(makers, 3)) &&
             PyTuple_GET_SIZE(*kinds) == 2 && PyTuple_Check(*node_types = PyTuple_GET_ITEM(makers, 4)) &&
             PyTuple_GET_SIZE(*node_types) == l->n;
    for (Py_ssize_t i = 0; ok && i < l->n; i++) {
        PyObject *t = PyTuple_GET_ITEM(*node_types, i);
        ok = PyTuple_Check(t) && PyTuple_GET_SIZE(t) == 2 && PyTuple_Check(PyTuple_GET_ITEM(t, 1)) &&
             PyTuple_GET_SIZE(PyTuple_GET_ITEM(t, 1)) == (Py_ssize_t)strlen(l->layouts[i]);
    }
    for (int i = 0; ok && i < 3; i++) {
        PyObject *pair = PyTuple_GET_ITEM(makers, i);
        ok = PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2 &&
             maker_init(&mk[i], PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1)) == 0 && mk[i].n == nfields[i];
    }
    if (ok) return 0;
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "makers: ((XValue, its 9 fields), (XNode, 5), (QuantParams, 8), "
                                         "2 quantization kinds, (node type, field names) per layout)");
    for (int j = 0; j < 3; j++) maker_clear(&mk[j]);
    return -1;
}

PyDoc_STRVAR(graph_doc, "graph(buf, end, root, budget, layouts, makers) -> ((XValue, ...), (XNode, ...), spent) | None\n"
                        "makers: ((XValue, fields), (XNode, fields), (QuantParams, fields), quantization kinds by tag, "
                        "(node type name, field names) by tag): what the items are built as.");

static PyObject *graph(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *buf, *layouts_obj, *makers, *kinds = NULL, *node_types = NULL;
    unsigned long long end, root;
    long long budget;
    if (!PyArg_ParseTuple(args, "OKKLO!O!", &buf, &end, &root, &budget, &PyTuple_Type, &layouts_obj, &PyTuple_Type,
                          &makers))
        return NULL;
    Layouts l;
    Maker mk[3] = {{NULL, {NULL}, 0}, {NULL, {NULL}, 0}, {NULL, {NULL}, 0}};
    if (setup(layouts_obj, makers, &l, mk, &kinds, &node_types) < 0) return NULL;
    PyObject *values = NULL, *nodes = NULL, *result = NULL;
    Py_buffer view;
    R r;
    T rt;
    int opened = open_root(buf, &view, end, root, budget, &r, &rt);
    if (opened < 0) goto out;
    int bad = opened;
    if (!bad) values = items(&r, &rt, 2, value_item, NULL, &bad);
    if (values) nodes = items(&r, &rt, 1, node_item, &l, &bad);
    if (nodes && objects(values, nodes, &mk[0], &mk[1], &mk[2], kinds, node_types) < 0) Py_CLEAR(nodes);
    if (nodes) result = Py_BuildValue("(NNL)", values, nodes, (long long)r.spent);
    else Py_XDECREF(values);
    PyBuffer_Release(&view);
    if (!result && bad && !PyErr_Occurred()) {
        result = Py_None;
        Py_INCREF(result);
    }
out:
    for (int j = 0; j < 3; j++) maker_clear(&mk[j]);
    return result;
}

PyDoc_STRVAR(constants_doc, "constants(buf, end, root, budget, section) -> (((offset, size, key), ...), spent) | None");

static PyObject *constants(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *buf;
    unsigned long long end, root, section;
    long long budget;
    if (!PyArg_ParseTuple(args, "OKKLK", &buf, &end, &root, &budget, &section)) return NULL;
    Py_buffer view;
    R r;
    T rt;
    int opened = open_root(buf, &view, end, root, budget, &r, &rt);
    if (opened < 0) return NULL;
    uint64_t sec = section;
    PyObject *consts = NULL, *result = NULL;
    int bad = opened;
    if (!bad) consts = items(&r, &rt, 8, constant_item, &sec, &bad);
    if (consts) result = Py_BuildValue("(NL)", consts, (long long)r.spent);
    PyBuffer_Release(&view);
    if (!result && bad && !PyErr_Occurred()) Py_RETURN_NONE;
    return result;
}

/* _FlatReader.string of a table's field on the fast path: a new str, "" when absent; NULL with *bad = 1 where
 * the reader would fail (bounds, alignment, no terminating 0, not strict UTF-8: the caller's checked path then
 * names it). Charged one object, as the reader charges a string. */
static PyObject *string(R *r, const T *t, uint32_t slot, int *bad) {
    int64_t p = field(r, t, slot, 4);
    if (p < 0) FALLBACK_NULL();
    if (p == 0) return PyUnicode_FromStringAndSize("", 0);
    int64_t v = ref(r, (uint64_t)p);
    if (v < 0 || (v & 3)) FALLBACK_NULL();
    uint64_t n = u32(r, (uint64_t)v), start = (uint64_t)v + 4;
    if (start + n > r->end || charge(r, 1) < 0 || start + n >= r->end || r->b[start + n] != 0) FALLBACK_NULL();
    PyObject *s = PyUnicode_DecodeUTF8((const char *)r->b + start, (Py_ssize_t)n, "strict");
    if (!s && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        FALLBACK_NULL();
    }
    return s;
}

#define XH_LENGTH 30

PyDoc_STRVAR(blob_doc,
             "blob(buf, budget, layouts, makers, constant_maker) -> (identifier, version, values, nodes, num_externs, "
             "input_ids, output_ids, constants, constant_offset, constant_size) | None\n"
             "A whole delegate blob with an XH00 header: the header's checks (parse_header), the identifier, the root "
             "table, version, xvalues, xnodes, num_externs, input_ids, output_ids and constant_data (as ConstantRef "
             "objects, constant_maker = (ConstantRef, its 4 fields)), charging the budget as _decode's fast path does. "
             "None wherever parse_blob's own path would raise or fall back, and for a blob without the header.");

static PyObject *blob(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *buf, *layouts_obj, *makers, *cmaker, *kinds = NULL, *node_types = NULL;
    long long budget;
    if (!PyArg_ParseTuple(args, "OLO!O!O!", &buf, &budget, &PyTuple_Type, &layouts_obj, &PyTuple_Type, &makers,
                          &PyTuple_Type, &cmaker))
        return NULL;
    Layouts l;
    Maker mk[3] = {{NULL, {NULL}, 0}, {NULL, {NULL}, 0}, {NULL, {NULL}, 0}}, cm = {NULL, {NULL}, 0};
    if (setup(layouts_obj, makers, &l, mk, &kinds, &node_types) < 0) return NULL;
    PyObject *version = NULL, *values = NULL, *nodes = NULL, *ins = NULL, *outs = NULL, *consts = NULL;
    PyObject *result = NULL;
    if (PyTuple_GET_SIZE(cmaker) != 2 || maker_init(&cm, PyTuple_GET_ITEM(cmaker, 0), PyTuple_GET_ITEM(cmaker, 1)) < 0 ||
        cm.n != 4) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "constant_maker: (ConstantRef, its 4 fields)");
        goto out;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE) < 0) goto out;
    const uint8_t *b = view.buf;
    uint64_t n = (uint64_t)view.len;
    int bad_ = 0, *bad = &bad_;
    /* parse_header: anything it would raise for, and a blob without the header, go to the Python path */
    if (n < XH_LENGTH || memcmp(b + 4, "XH00", 4) != 0) FALLBACK();
    uint16_t length;
    uint32_t fb_off, fb_size, cd_off;
    uint64_t cd_size;
    memcpy(&length, b + 8, 2);
    memcpy(&fb_off, b + 10, 4);
    memcpy(&fb_size, b + 14, 4);
    memcpy(&cd_off, b + 18, 4);
    memcpy(&cd_size, b + 22, 8);
    if (length < XH_LENGTH || fb_size < 8 || fb_off > n || fb_size > n - fb_off || cd_off > n || cd_size > n - cd_off ||
        cd_off < fb_off || cd_off - fb_off < fb_size)
        FALLBACK();
    const uint8_t *fb = b + fb_off;
    if (memcmp(fb + 4, "XN01", 4) != 0 && memcmp(fb + 4, "XN00", 4) != 0) FALLBACK();
    R r = {fb, fb_size, budget, 0};
    T rt;
    uint64_t ne, section = cd_size;
    if (table(&r, u32(&r, 0), &rt, 1) < 0) FALLBACK(); /* the root, charged as _FlatReader.table charges it */
    if (!(version = string(&r, &rt, 0, bad))) goto fail;
    if (!(values = items(&r, &rt, 2, value_item, NULL, bad))) goto fail;
    if (!(nodes = items(&r, &rt, 1, node_item, &l, bad))) goto fail;
    if (objects(values, nodes, &mk[0], &mk[1], &mk[2], kinds, node_types) < 0) goto fail;
    if (scalar(&r, &rt, 3, 4, &ne) < 0) FALLBACK();
    if (!(ins = u32_tuple(&r, &rt, 4, bad)) || !(outs = u32_tuple(&r, &rt, 5, bad))) goto fail;
    if (!(consts = items(&r, &rt, 8, constant_item, &section, bad))) goto fail;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(consts); i++) { /* (offset, size, key) -> ConstantRef */
        PyObject *c = PyTuple_GET_ITEM(consts, i);
        PyObject *cv[4] = {PyTuple_GET_ITEM(c, 0), PyTuple_GET_ITEM(c, 1), PyTuple_GET_ITEM(c, 2), Py_None};
        PyObject *o = make(&cm, cv);
        if (!o) goto fail;
        PyTuple_SET_ITEM(consts, i, o);
        Py_DECREF(c);
    }
    result = Py_BuildValue("(s#NNNkNNNkK)", (const char *)fb + 4, (Py_ssize_t)4, version, values, nodes,
                           (unsigned long)(uint32_t)ne, ins, outs, consts, (unsigned long)cd_off,
                           (unsigned long long)cd_size);
    version = values = nodes = ins = outs = consts = NULL; /* stolen by N (released by it on failure too) */
fail:
    Py_XDECREF(version);
    Py_XDECREF(values);
    Py_XDECREF(nodes);
    Py_XDECREF(ins);
    Py_XDECREF(outs);
    Py_XDECREF(consts);
    PyBuffer_Release(&view);
    if (!result && *bad && !PyErr_Occurred()) {
        result = Py_None;
        Py_INCREF(result);
    }
out:
    for (int j = 0; j < 3; j++) maker_clear(&mk[j]);
    maker_clear(&cm);
    return result;
}

static PyMethodDef methods[] = {
    {"graph", graph, METH_VARARGS, graph_doc},
    {"constants", constants, METH_VARARGS, constants_doc},
    {"blob", blob, METH_VARARGS, blob_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "orchestra.backends.xnnpack._xdecode",
    .m_doc = "C decoding of an XNNPACK delegate blob's values, nodes and constants (backends/xnnpack/_blob.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__xdecode(void) { return PyModule_Create(&module); }
