/* orchestra.runtime._plan: the per-value loop of CompiledPlan.__init__ and the per-value loops
 * of Method.__init__ (orchestra/runtime/_method.py) in C (optional; the Python code there is the
 * reference and the fallback).
 *
 * values() classifies a plan's values as the Python loop of CompiledPlan.__init__ does and makes
 * the same objects for the common ones: a literal's Python object into the template, a read-only
 * numpy view of the constant segment for a constant, a _Slot for a planned tensor, (optional,
 * items) for a list value. It vouches only for values that the Python loop would take without
 * an error or a side effect, reading them as exactly the schema's classes with exactly int /
 * tuple fields; every other value (another class, a field of another type or out of range, a
 * tensor with extra info, an initial value or a transposed constant, a bad list item) it
 * returns to the caller, which runs the Python code over those, in order: that code raises the
 * errors, with their messages, and makes the side effects as it always did.
 *
 * views() and lists() are the two loops of Method.__init__ that make one object per planned
 * tensor and per list value. They stop at the first entry not of the shape the compiled plan
 * makes (ints in range) and say how far they got: the caller's Python loop does the rest.
 *
 * Nothing here indexes with a number it has not checked, and nothing allocates memory sized
 * by the file but the objects returned. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <limits.h>
#include <stdint.h>

#if PY_VERSION_HEX >= 0x030C0000
#define OBJECT_EX_MEMBER Py_T_OBJECT_EX
#else
#define OBJECT_EX_MEMBER T_OBJECT_EX
#endif

/* -- the classes read and built ------------------------------------------------------------- */

enum {
    K_EVALUE,
    K_TENSOR,
    K_ALLOC,
    K_NULL,
    K_INT,
    K_BOOL,
    K_DOUBLE,
    K_STRING,
    K_INTLIST,
    K_DOUBLELIST,
    K_BOOLLIST,
    K_TENSORLIST,
    K_OPTIONALTENSORLIST,
    NKINDS
};

static const char *const KIND_NAMES[NKINDS] = {
    "EValue", "Tensor", "AllocationDetails", "Null", "Int", "Bool", "Double", "String",
    "IntList", "DoubleList", "BoolList", "TensorList", "OptionalTensorList",
};

/* _Slot's fields, in the order values() sets them. */
enum { S_MEMORY_ID, S_OFFSET, S_DTYPE, S_BOUND, S_DIM_ORDER, S_DYNAMIC, S_CAPACITY, S_CONTIGUOUS, NSLOT };

static const char *const SLOT_FIELDS[NSLOT] = {
    "memory_id", "offset", "dtype", "bound", "dim_order", "dynamic", "capacity", "contiguous",
};

/* Attribute names read from the schema's objects (interned once). */
enum {
    A_VAL,
    A_SCALAR_TYPE,
    A_SIZES,
    A_DIM_ORDER,
    A_DATA_BUFFER_IDX,
    A_ALLOCATION_INFO,
    A_SHAPE_DYNAMISM,
    A_EXTRA_TENSOR_INFO,
    A_MEMORY_ID,
    A_OFFSET_LOW,
    A_OFFSET_HIGH,
    A_INT_VAL,
    A_BOOL_VAL,
    A_DOUBLE_VAL,
    A_STRING_VAL,
    A_ITEMS,
    NATTRS
};

static const char *const ATTR_NAMES[NATTRS] = {
    "val", "scalar_type", "sizes", "dim_order", "data_buffer_idx", "allocation_info", "shape_dynamism",
    "extra_tensor_info", "memory_id", "memory_offset_low", "memory_offset_high", "int_val", "bool_val",
    "double_val", "string_val", "items",
};

static PyTypeObject *kinds[NKINDS]; /* strong references */
static PyTypeObject *slot_type;     /* _Slot, strong */
static Py_ssize_t slot_offset[NSLOT];
static PyObject *ndarray;           /* numpy.ndarray, strong */
static PyObject *attrs[NATTRS];     /* interned names, strong */
static int ready;

static void clear_setup(void) {
    ready = 0;
    for (int k = 0; k < NKINDS; k++) Py_CLEAR(kinds[k]);
    Py_CLEAR(slot_type);
    Py_CLEAR(ndarray);
}

PyDoc_STRVAR(setup_doc,
             "setup(classes, slot_class, ndarray)\n\n"
             "classes: the schema classes EValue, Tensor, AllocationDetails, Null, Int, Bool, Double, String,\n"
             "IntList, DoubleList, BoolList, TensorList, OptionalTensorList, in that order (values are read as\n"
             "exactly these, by attribute). slot_class: _method._Slot, whose fields memory_id, offset, dtype,\n"
             "bound, dim_order, dynamic, capacity, contiguous must be writable object slots (they are set\n"
             "directly, without its __init__). ndarray: numpy.ndarray, called to make each view.");

static PyObject *setup(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *classes, *sc, *nd;
    if (!PyArg_ParseTuple(args, "O!O!O", &PyTuple_Type, &classes, &PyType_Type, &sc, &nd)) return NULL;
    clear_setup();
    if (PyTuple_GET_SIZE(classes) != NKINDS) {
        PyErr_Format(PyExc_ValueError, "classes must hold %d classes", NKINDS);
        return NULL;
    }
    for (int k = 0; k < NKINDS; k++) {
        PyObject *t = PyTuple_GET_ITEM(classes, k);
        if (!PyType_Check(t)) {
            PyErr_Format(PyExc_TypeError, "classes[%d] (%s) is not a class", k, KIND_NAMES[k]);
            goto fail;
        }
        Py_INCREF(t);
        kinds[k] = (PyTypeObject *)t;
    }
    PyTypeObject *st = (PyTypeObject *)sc;
    if (st->tp_new != PyBaseObject_Type.tp_new || st->tp_alloc == NULL || st->tp_itemsize != 0) {
        PyErr_SetString(PyExc_TypeError, "slot_class must be a plain class (object's __new__, no variable size)");
        goto fail;
    }
    for (int i = 0; i < NSLOT; i++) {
        PyObject *d = PyObject_GetAttrString(sc, SLOT_FIELDS[i]);
        if (d == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) goto fail;
            PyErr_Clear();
        }
        int ok = d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type);
        if (ok) {
            PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
            ok = m->type == OBJECT_EX_MEMBER && !(m->flags & READONLY) && m->offset >= (Py_ssize_t)sizeof(PyObject) &&
                 m->offset + (Py_ssize_t)sizeof(PyObject *) <= st->tp_basicsize &&
                 PyType_IsSubtype(st, ((PyDescrObject *)d)->d_type);
            for (int j = 0; ok && j < i; j++) ok = slot_offset[j] != m->offset;
            if (ok) slot_offset[i] = m->offset;
        }
        Py_XDECREF(d);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "slot_class.%s is not a writable object slot", SLOT_FIELDS[i]);
            goto fail;
        }
    }
    Py_INCREF(sc);
    slot_type = st;
    Py_INCREF(nd);
    ndarray = nd;
    for (int a = 0; a < NATTRS; a++) {
        if (attrs[a] == NULL && (attrs[a] = PyUnicode_InternFromString(ATTR_NAMES[a])) == NULL) goto fail;
    }
    ready = 1;
    Py_RETURN_NONE;
fail:
    clear_setup();
    return NULL;
}

/* -- reading the decoded objects ----------------------------------------------------------- */

/* *v = the int o when it is exactly an int in [lo, hi]; -1 otherwise (no error left set). */
static int int_in(PyObject *o, long long lo, long long hi, long long *v) {
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

/* getattr(o, attrs[a]) (new reference), or NULL with no error set when it is missing; -1 in
 * *err on any other error (then set). */
static PyObject *get(PyObject *o, int a, int *err) {
    PyObject *r = PyObject_GetAttr(o, attrs[a]);
    if (r == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) PyErr_Clear();
        else *err = -1;
    }
    return r;
}

/* Exactly a tuple of ints >= 0, below 2**56 each, with their product in *numel (-1 when it
 * would pass 2**62). 0 if so, -1 otherwise. */
static int sizes_of(PyObject *sizes, long long *numel) {
    if (sizes == NULL || !PyTuple_CheckExact(sizes)) return -1;
    long long n = 1, x;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(sizes); j++) {
        if (int_in(PyTuple_GET_ITEM(sizes, j), 0, INT64_C(1) << 56, &x) < 0) return -1;
        if (n >= 0 && x != 0 && n > (INT64_C(1) << 62) / x) n = -1;
        else if (n >= 0 || x == 0) n *= x;
    }
    *numel = n;
    return 0;
}

/* 1 when dim_order (exactly a tuple of ints) is empty or range(ndim): _in_order; 0 when it is
 * another tuple of ints; -1 when it is not a tuple of ints. */
static int in_order(PyObject *order, Py_ssize_t ndim) {
    if (order == NULL || !PyTuple_CheckExact(order)) return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(order);
    int same = n == 0 || n == ndim;
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *d = PyTuple_GET_ITEM(order, j);
        if (!PyLong_CheckExact(d)) return -1;
        if (same) {
            int overflow;
            long long x = PyLong_AsLongLongAndOverflow(d, &overflow);
            if (x == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                return -1;
            }
            same = !overflow && x == (long long)j;
        }
    }
    return same;
}

/* A new _Slot with the given fields (references stolen, also on failure). */
static PyObject *new_slot(PyObject **fields) {
    int i;
    for (i = 0; i < NSLOT; i++) {
        if (fields[i] == NULL) goto fail;
    }
    PyObject *o = slot_type->tp_alloc(slot_type, 0);
    if (o == NULL) goto fail;
    for (i = 0; i < NSLOT; i++) *(PyObject **)((char *)o + slot_offset[i]) = fields[i]; /* NULL in a fresh object */
    return o;
fail:
    for (i = 0; i < NSLOT; i++) Py_XDECREF(fields[i]);
    return NULL;
}

/* What values() made of one value. */
enum { R_DONE, R_TODO, R_ERROR };

typedef struct {
    PyObject *template, *slots, *lists, *runtime; /* outputs */
    PyObject *dtypes;                              /* tuple: scalar type -> numpy dtype or None */
    PyObject *segment;                             /* uint8 array over the constant segment, or None */
    long long seglen;
    PyObject *offsets; /* tuple: constant index -> offset in the segment */
    long long nv, static_dynamism;
} Ctx;

static int set_item(PyObject *list, Py_ssize_t i, PyObject *v) {
    if (v == NULL) return -1;
    PyObject *old = PyList_GET_ITEM(list, i);
    PyList_SET_ITEM(list, i, v);
    Py_DECREF(old);
    return 0;
}

static int append_index(PyObject *list, Py_ssize_t i) {
    PyObject *x = PyLong_FromSsize_t(i);
    if (x == NULL) return -1;
    int r = PyList_Append(list, x);
    Py_DECREF(x);
    return r;
}

static int tensor(Ctx *c, Py_ssize_t i, PyObject *v) {
    int err = 0, r = R_TODO;
    long long st, idx, numel, dyn;
    PyObject *extra = NULL, *sizes = NULL, *order = NULL, *styp = NULL, *a = NULL, *bidx = NULL, *sd = NULL;
    PyObject *mid = NULL, *lo = NULL, *hi = NULL;
    extra = get(v, A_EXTRA_TENSOR_INFO, &err);
    if (extra != Py_None) goto done; /* (also when missing or on error: err says which) */
    sizes = get(v, A_SIZES, &err);
    order = get(v, A_DIM_ORDER, &err);
    styp = get(v, A_SCALAR_TYPE, &err);
    a = get(v, A_ALLOCATION_INFO, &err);
    bidx = get(v, A_DATA_BUFFER_IDX, &err);
    if (err || a == NULL || sizes_of(sizes, &numel) < 0 || int_in(bidx, LLONG_MIN, LLONG_MAX, &idx) < 0 ||
        int_in(styp, 0, (long long)PyTuple_GET_SIZE(c->dtypes) - 1, &st) < 0)
        goto done;
    PyObject *dtype = PyTuple_GET_ITEM(c->dtypes, st);
    int ordered = in_order(order, PyTuple_GET_SIZE(sizes));
    if (dtype == Py_None || ordered < 0) goto done;
    if (a == Py_None && idx > 0) { /* a constant: a view of the segment at its offset */
        long long off, itemsize;
        if (c->segment == Py_None || !ordered || numel <= 0 || idx >= PyTuple_GET_SIZE(c->offsets) ||
            int_in(PyTuple_GET_ITEM(c->offsets, idx), 0, c->seglen, &off) < 0)
            goto done;
        PyObject *isz = PyObject_GetAttrString(dtype, "itemsize");
        if (isz == NULL) {
            err = -1;
            goto done;
        }
        int bad = int_in(isz, 1, 64, &itemsize);
        Py_DECREF(isz);
        if (bad < 0 || numel > (c->seglen - off) / itemsize) goto done; /* np.frombuffer's error: Python's */
        PyObject *o = PyLong_FromLongLong(off);
        if (o == NULL) {
            err = -1;
            goto done;
        }
        PyObject *args[4] = {sizes, dtype, c->segment, o};
        PyObject *arr = PyObject_Vectorcall(ndarray, args, 4, NULL);
        Py_DECREF(o);
        if (arr == NULL || set_item(c->template, i, arr) < 0) {
            err = -1;
            goto done;
        }
        r = R_DONE;
    } else if (a != Py_None && idx <= 0) { /* planned, no initial value: a _Slot */
        long long m, l, h;
        if (!Py_IS_TYPE(a, kinds[K_ALLOC]) || numel < 0) goto done;
        mid = get(a, A_MEMORY_ID, &err);
        lo = get(a, A_OFFSET_LOW, &err);
        hi = get(a, A_OFFSET_HIGH, &err);
        sd = get(v, A_SHAPE_DYNAMISM, &err);
        if (err || int_in(mid, LLONG_MIN, LLONG_MAX, &m) < 0 || int_in(lo, 0, 0xFFFFFFFFLL, &l) < 0 ||
            int_in(hi, 0, 0x7FFFFFFFLL, &h) < 0 || int_in(sd, LLONG_MIN, LLONG_MAX, &dyn) < 0)
            goto done;
        Py_INCREF(mid);
        Py_INCREF(dtype);
        Py_INCREF(sizes);
        Py_INCREF(order);
        PyObject *f[NSLOT] = {
            [S_MEMORY_ID] = mid,
            [S_OFFSET] = PyLong_FromLongLong(h << 32 | l),
            [S_DTYPE] = dtype,
            [S_BOUND] = sizes,
            [S_DIM_ORDER] = order,
            [S_DYNAMIC] = PyBool_FromLong(dyn != c->static_dynamism),
            [S_CAPACITY] = PyLong_FromLongLong(numel),
            [S_CONTIGUOUS] = PyBool_FromLong(ordered),
        };
        if (set_item(c->slots, i, new_slot(f)) < 0) {
            err = -1;
            goto done;
        }
        r = R_DONE;
    } else if (a == Py_None) { /* neither constant nor planned: known only at run time */
        if (append_index(c->runtime, i) < 0) {
            err = -1;
            goto done;
        }
        r = R_DONE;
    }
done:
    Py_XDECREF(extra);
    Py_XDECREF(sizes);
    Py_XDECREF(order);
    Py_XDECREF(styp);
    Py_XDECREF(a);
    Py_XDECREF(bidx);
    Py_XDECREF(sd);
    Py_XDECREF(mid);
    Py_XDECREF(lo);
    Py_XDECREF(hi);
    return err ? R_ERROR : r;
}

static int value(Ctx *c, Py_ssize_t i, PyObject *ev) {
    int err = 0, r = R_TODO;
    if (!Py_IS_TYPE(ev, kinds[K_EVALUE])) return R_TODO;
    PyObject *v = get(ev, A_VAL, &err), *x = NULL;
    if (v == NULL) return err ? R_ERROR : R_TODO;
    PyTypeObject *t = Py_TYPE(v);
    if (t == kinds[K_TENSOR]) {
        r = tensor(c, i, v);
    } else if (t == kinds[K_INT] || t == kinds[K_BOOL] || t == kinds[K_DOUBLE] || t == kinds[K_STRING]) {
        int a = t == kinds[K_INT] ? A_INT_VAL : t == kinds[K_BOOL] ? A_BOOL_VAL : t == kinds[K_DOUBLE] ? A_DOUBLE_VAL : A_STRING_VAL;
        x = get(v, a, &err);
        if (x != NULL) {
            Py_INCREF(x);
            if (set_item(c->template, i, x) < 0) err = -1;
            r = R_DONE;
        }
    } else if (t == kinds[K_INTLIST] || t == kinds[K_TENSORLIST] || t == kinds[K_OPTIONALTENSORLIST]) {
        int optional = t == kinds[K_OPTIONALTENSORLIST];
        long long it;
        int ok = (x = get(v, A_ITEMS, &err)) != NULL && PyTuple_CheckExact(x);
        for (Py_ssize_t j = 0; ok && j < PyTuple_GET_SIZE(x); j++) {
            ok = int_in(PyTuple_GET_ITEM(x, j), -optional, c->nv - 1, &it) == 0;
        }
        if (ok) {
            PyObject *entry = PyTuple_Pack(2, optional ? Py_True : Py_False, x);
            PyObject *key = PyLong_FromSsize_t(i);
            if (entry == NULL || key == NULL || PyDict_SetItem(c->lists, key, entry) < 0) err = -1;
            Py_XDECREF(entry);
            Py_XDECREF(key);
            r = R_DONE;
        }
    } else if (t == kinds[K_DOUBLELIST] || t == kinds[K_BOOLLIST]) {
        if ((x = get(v, A_ITEMS, &err)) != NULL && PyTuple_CheckExact(x)) {
            if (set_item(c->template, i, PySequence_List(x)) < 0) err = -1;
            r = R_DONE;
        }
    } else if (v == Py_None || t == kinds[K_NULL]) {
        r = R_DONE; /* nothing: None in the template */
    }
    Py_XDECREF(x);
    Py_DECREF(v);
    return err ? R_ERROR : r;
}

PyDoc_STRVAR(values_doc,
             "values(values, dtypes, segment, offsets, static) -> (template, slots, lists, runtime, todo)\n\n"
             "The Python loop over a plan's values (a tuple of EValue) in CompiledPlan.__init__, for the values it\n"
             "vouches for: template and slots (lists of len(values), None where nothing is made), lists (value ->\n"
             "(optional, items)), runtime (tensors neither constant nor planned, in order), and todo: the indices,\n"
             "in order, of the values the caller must take through its Python code. dtypes: the numpy dtype of\n"
             "each scalar type by its number (None: unsupported); segment: a uint8 numpy array over the constant\n"
             "segment, or None (the legacy constant_buffer, or no constants); offsets: the constant segment's\n"
             "offsets; static: TensorShapeDynamism.STATIC's number.");

static PyObject *values(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *vals, *dtypes, *segment, *offsets;
    long long stat;
    if (!PyArg_ParseTuple(args, "O!O!OO!L", &PyTuple_Type, &vals, &PyTuple_Type, &dtypes, &segment, &PyTuple_Type,
                          &offsets, &stat))
        return NULL;
    if (!ready) {
        PyErr_SetString(PyExc_RuntimeError, "orchestra.runtime._plan.setup() has not been called");
        return NULL;
    }
    Py_ssize_t nv = PyTuple_GET_SIZE(vals);
    Ctx c = {NULL, NULL, NULL, NULL, dtypes, segment, 0, offsets, (long long)nv, stat};
    if (segment != Py_None) {
        Py_ssize_t n = PyObject_Length(segment);
        if (n < 0) return NULL;
        c.seglen = (long long)n;
    }
    PyObject *todo = PyList_New(0);
    c.template = PyList_New(nv);
    c.slots = PyList_New(nv);
    c.lists = PyDict_New();
    c.runtime = PyList_New(0);
    if (todo == NULL || c.template == NULL || c.slots == NULL || c.lists == NULL || c.runtime == NULL) goto fail;
    for (Py_ssize_t i = 0; i < nv; i++) {
        Py_INCREF(Py_None);
        PyList_SET_ITEM(c.template, i, Py_None);
        Py_INCREF(Py_None);
        PyList_SET_ITEM(c.slots, i, Py_None);
    }
    for (Py_ssize_t i = 0; i < nv; i++) {
        int r = value(&c, i, PyTuple_GET_ITEM(vals, i));
        if (r == R_ERROR || (r == R_TODO && append_index(todo, i) < 0)) goto fail;
    }
    return Py_BuildValue("(NNNNN)", c.template, c.slots, c.lists, c.runtime, todo);
fail:
    Py_XDECREF(todo);
    Py_XDECREF(c.template);
    Py_XDECREF(c.slots);
    Py_XDECREF(c.lists);
    Py_XDECREF(c.runtime);
    return NULL;
}

PyDoc_STRVAR(planned_doc,
             "planned(slots) -> (planned, planned_views, planned_strided) or None\n\n"
             "CompiledPlan's tuples of its planned tensors from its slots (a list of _Slot or None): their value\n"
             "indices, (value, bound, dtype, memory_id, offset) of the contiguous ones, the value indices of the\n"
             "others. None when an entry is neither None nor exactly a _Slot with every field set: the caller\n"
             "then makes them in Python.");

static PyObject *planned(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *slots;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &slots)) return NULL;
    if (!ready) {
        PyErr_SetString(PyExc_RuntimeError, "orchestra.runtime._plan.setup() has not been called");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(slots), np = 0, nc = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = PyList_GET_ITEM(slots, i);
        if (s == Py_None) continue;
        if (!Py_IS_TYPE(s, slot_type)) Py_RETURN_NONE;
        for (int f = 0; f < NSLOT; f++) {
            if (*(PyObject **)((char *)s + slot_offset[f]) == NULL) Py_RETURN_NONE;
        }
        np++;
    }
    PyObject *all = PyTuple_New(np), *views = NULL, *strided = NULL, *tmp = NULL;
    if (all == NULL) return NULL;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n && k < np; i++) {
        PyObject *s = PyList_GET_ITEM(slots, i);
        if (s == Py_None) continue;
        PyObject *x = PyLong_FromSsize_t(i);
        if (x == NULL) goto fail;
        PyTuple_SET_ITEM(all, k++, x);
        int c = PyObject_IsTrue(*(PyObject **)((char *)s + slot_offset[S_CONTIGUOUS]));
        if (c < 0) goto fail;
        nc += c;
    }
    views = PyTuple_New(nc);
    strided = PyTuple_New(np - nc);
    if (views == NULL || strided == NULL) goto fail;
    Py_ssize_t kv = 0, ks = 0;
    for (k = 0; k < np; k++) {
        PyObject *x = PyTuple_GET_ITEM(all, k);
        PyObject *s = PyList_GET_ITEM(slots, PyLong_AsSsize_t(x));
#define FIELD(f) (*(PyObject **)((char *)s + slot_offset[f]))
        int c = PyObject_IsTrue(FIELD(S_CONTIGUOUS));
        if (c < 0) goto fail;
        if (c && kv < nc) {
            tmp = PyTuple_Pack(5, x, FIELD(S_BOUND), FIELD(S_DTYPE), FIELD(S_MEMORY_ID), FIELD(S_OFFSET));
            if (tmp == NULL) goto fail;
            PyTuple_SET_ITEM(views, kv++, tmp);
        } else if (!c && ks < np - nc) {
            Py_INCREF(x);
            PyTuple_SET_ITEM(strided, ks++, x);
        } else {
            PyErr_SetString(PyExc_RuntimeError, "a _Slot's contiguous changed while read");
            goto fail;
        }
#undef FIELD
    }
    return Py_BuildValue("(NNN)", all, views, strided);
fail:
    Py_XDECREF(all);
    Py_XDECREF(views);
    Py_XDECREF(strided);
    return NULL;
}

/* -- Method.__init__ ------------------------------------------------------------------------- */

PyDoc_STRVAR(views_doc,
             "views(vals, planned_views, arenas) -> int\n\n"
             "vals[i] = numpy.ndarray(shape, dtype, arenas[mid], offset) for each (i, shape, dtype, mid, offset) of\n"
             "planned_views (CompiledPlan.planned_views), in order: a Method's views of its planned tensors. Stops\n"
             "at an entry not of that shape (ints in range) and returns how many it made: the caller makes the\n"
             "rest.");

static PyObject *views(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *vals, *pv, *arenas;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyList_Type, &vals, &PyTuple_Type, &pv, &PyList_Type, &arenas)) return NULL;
    if (!ready) {
        PyErr_SetString(PyExc_RuntimeError, "orchestra.runtime._plan.setup() has not been called");
        return NULL;
    }
    Py_ssize_t k;
    for (k = 0; k < PyTuple_GET_SIZE(pv); k++) {
        PyObject *e = PyTuple_GET_ITEM(pv, k);
        long long i, m;
        if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != 5 ||
            int_in(PyTuple_GET_ITEM(e, 0), 0, (long long)PyList_GET_SIZE(vals) - 1, &i) < 0 ||
            int_in(PyTuple_GET_ITEM(e, 3), 0, (long long)PyList_GET_SIZE(arenas) - 1, &m) < 0)
            break;
        PyObject *a[4] = {PyTuple_GET_ITEM(e, 1), PyTuple_GET_ITEM(e, 2), PyList_GET_ITEM(arenas, m),
                          PyTuple_GET_ITEM(e, 4)};
        if (set_item(vals, (Py_ssize_t)i, PyObject_Vectorcall(ndarray, a, 4, NULL)) < 0) return NULL;
    }
    return PyLong_FromSsize_t(k);
}

PyDoc_STRVAR(lists_doc,
             "lists(vals, lists) -> int\n\n"
             "vals[i] = a new list of vals[j] for j in items (None for an optional list's -1) for each\n"
             "i: (optional, items) of lists (CompiledPlan.lists), in its order: a Method's list values. Stops at\n"
             "an entry not of that shape (a bool, a tuple of ints in range) and returns how many it built: the\n"
             "caller builds the rest.");

static PyObject *lists(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *vals, *ls, *key, *entry;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &vals, &PyDict_Type, &ls)) return NULL;
    Py_ssize_t pos = 0, done = 0, nv = PyList_GET_SIZE(vals);
    while (PyDict_Next(ls, &pos, &key, &entry)) {
        long long i, j = 0;
        if (int_in(key, 0, (long long)nv - 1, &i) < 0 || !PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2 ||
            !PyBool_Check(PyTuple_GET_ITEM(entry, 0)) || !PyTuple_CheckExact(PyTuple_GET_ITEM(entry, 1)))
            break;
        int optional = PyTuple_GET_ITEM(entry, 0) == Py_True;
        PyObject *items = PyTuple_GET_ITEM(entry, 1);
        Py_ssize_t n = PyTuple_GET_SIZE(items), q;
        for (q = 0; q < n; q++) { /* a value index, or an optional list's -1 */
            if (int_in(PyTuple_GET_ITEM(items, q), -optional, (long long)nv - 1, &j) < 0) break;
        }
        if (q < n) break;
        PyObject *out = PyList_New(n);
        if (out == NULL) return NULL;
        for (q = 0; q < n; q++) {
            int_in(PyTuple_GET_ITEM(items, q), -1, (long long)nv - 1, &j); /* (checked above) */
            PyObject *x = j < 0 ? Py_None : PyList_GET_ITEM(vals, j);
            Py_INCREF(x);
            PyList_SET_ITEM(out, q, x);
        }
        if (set_item(vals, (Py_ssize_t)i, out) < 0) return NULL;
        done++;
    }
    return PyLong_FromSsize_t(done);
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, setup_doc},
    {"values", values, METH_VARARGS, values_doc},
    {"planned", planned, METH_VARARGS, planned_doc},
    {"views", views, METH_VARARGS, views_doc},
    {"lists", lists, METH_VARARGS, lists_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "orchestra.runtime._plan",
    .m_doc = "C loops over a plan's values for CompiledPlan and Method (orchestra.runtime._method).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__plan(void) { return PyModule_Create(&module); }
