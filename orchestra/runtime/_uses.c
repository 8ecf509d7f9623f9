/* orchestra.runtime._uses: the hot loops of a plan's analysis (orchestra/runtime/_optimize.py)
 * in C: the use analysis' loop (scan), _Storage's memory proofs, _Matcher's per-plan tables and
 * the chain walks over them. Every function gives exactly its Python counterpart's answers, or
 * hands the question back to that code (None, or the caller's ``ask`` object for one answer);
 * tests/test_load_analysis.py compares them on every fixture and real model and on random
 * plans, and tests/test_without_extensions.py runs every fixture with this module blocked.
 *
 * scan(instructions, rets, lists, ops, KernelCall, MoveCall, FreeCall) walks the plan's
 * instructions once and fills, for the kernel calls, moves and frees, the same dicts as the
 * Python loop: mentions / writers / defines (value -> set of instruction numbers) and
 * first_mention / first_write / first_define (value -> least instruction number). It returns
 * those six dicts and the list of instruction numbers it left to the caller (delegate calls,
 * jumps, anything else), which the caller analyses the Python way and merges (taking the least
 * instruction number for the firsts).
 *
 * ``rets[pc]`` is what a kernel call writes (a tuple; empty or None: its arguments), ``lists``
 * maps a list value to (optional, items), ``ops[op_index]`` is (number of parameters, frozenset
 * of out parameter positions) or None when the operator has no kernel. Argument indices are
 * Python ints (the program reader checked them); anything of another shape (an operator entry
 * or list that is not as described, an index past the operators) makes the instruction one
 * the caller handles.
 *
 * The other functions are the hot loops of _optimize._Storage, the memory proofs of the plan
 * rewrites (layout, writes_at, reads, mem_reads, own_writes, group, cover: see each). Each gives
 * exactly what its Python counterpart gives, or None (cover: False) when an input is not of
 * the shape that Python code is written for (an int beyond 64 bits, an object of another
 * type): the caller then runs its Python code, which answers (or raises) as it always did.
 *
 * The last ones are tables of _optimize._Matcher's answers, made once per plan where the Python
 * matchers would each make a dozen small calls per question (layout_links: layout_link of
 * every instruction; ew_ops: ew_op's; conv_folds: conv's, with the convolution's literals and the
 * checks of the batch norm after it; const_copies: _constant_copy's checks; same_bytes:
 * _Storage.same_bytes' groups). Per instruction they give the Python answer, or the caller's
 * ``ask`` object where something is not of the shape the Python code makes (then it answers that
 * one). The chain walks go over those tables: ew_chain (an elementwise chain from one
 * instruction) and ew_static_ok (its memory checks); producer, layout_chain and chain_sources (the
 * layout copies feeding a matmul's or a delegate's operand).
 * The inputs derive from a .pte file: nothing here indexes with a value it has not checked. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Up to this many values named by one instruction are handled here (lists expanded). */
#define MAX_NAMED 4096

typedef struct {
    PyObject *obj[MAX_NAMED];
    Py_ssize_t n;
} Named;

/* ``seq`` (a tuple of ints) with each list value's members (those >= 0) after it. 0 when
 * something is not of the expected shape (too many values, an item not an int). */
static int expand(PyObject *seq, PyObject *lists, int have_lists, Named *out) {
    out->n = 0;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *i = PyTuple_GET_ITEM(seq, k);
        if (!PyLong_CheckExact(i) || out->n >= MAX_NAMED) return 0;
        out->obj[out->n++] = i;
        if (!have_lists) continue;
        PyObject *lst = PyDict_GetItemWithError(lists, i);
        if (lst == NULL) {
            if (PyErr_Occurred()) return -1;
            continue;
        }
        if (!PyTuple_Check(lst) || PyTuple_GET_SIZE(lst) != 2 || !PyTuple_Check(PyTuple_GET_ITEM(lst, 1))) return 0;
        PyObject *items = PyTuple_GET_ITEM(lst, 1);
        Py_ssize_t m = PyTuple_GET_SIZE(items);
        for (Py_ssize_t q = 0; q < m; q++) {
            PyObject *j = PyTuple_GET_ITEM(items, q);
            if (!PyLong_CheckExact(j)) return 0;
            long v = PyLong_AsLong(j);
            if (v == -1 && PyErr_Occurred()) return -1;
            if (v < 0) continue;
            if (out->n >= MAX_NAMED) return 0;
            out->obj[out->n++] = j;
        }
    }
    return 1;
}

/* sets[i].add(pc), creating the set and first[i] = pc when i is new. */
static int add_use(PyObject *sets, PyObject *first, PyObject *i, PyObject *pc) {
    PyObject *s = PyDict_GetItemWithError(sets, i);
    if (s != NULL) return PySet_Add(s, pc);
    if (PyErr_Occurred()) return -1;
    s = PySet_New(NULL);
    if (s == NULL) return -1;
    int bad = PySet_Add(s, pc) < 0 || PyDict_SetItem(sets, i, s) < 0;
    Py_DECREF(s);
    if (bad) return -1;
    if (PyDict_SetDefault(first, i, pc) == NULL) return -1;
    return 0;
}

static int is_list(PyObject *lists, int have_lists, PyObject *i) {
    if (!have_lists) return 0;
    return PyDict_Contains(lists, i);
}

static int same(PyObject *a, PyObject *b) {
    return a == b || PyObject_RichCompareBool(a, b, Py_EQ);
}

/* The defines of a kernel call (see analyse_uses): a result is defined when its parameters
 * name it once, as an out parameter, or not at all (list members counting where they are
 * named). 1 done, -1 error. */
static int kernel_defines(PyObject *params, PyObject *outs, const Named *wrote, PyObject *lists, int have_lists,
                          PyObject *defines, PyObject *first_define, PyObject *pc) {
    Py_ssize_t np_ = PyTuple_GET_SIZE(params);
    int any_list = 0;
    for (Py_ssize_t p = 0; p < np_ && have_lists; p++) {
        int r = is_list(lists, have_lists, PyTuple_GET_ITEM(params, p));
        if (r < 0) return -1;
        if (r) any_list = 1;
    }
    for (Py_ssize_t k = 0; k < wrote->n; k++) {
        PyObject *i = wrote->obj[k];
        int r = is_list(lists, have_lists, i);
        if (r < 0) return -1;
        if (r) continue;
        Py_ssize_t count = 0, at = -1;
        for (Py_ssize_t p = 0; p < np_; p++) {
            PyObject *j = PyTuple_GET_ITEM(params, p);
            int eq = same(j, i);
            if (eq < 0) return -1;
            if (eq) {
                if (count++ == 0) at = p;
            }
            if (any_list) {  /* each time i is a member of list parameter j */
                PyObject *lst = PyDict_GetItemWithError(lists, j);
                if (lst == NULL) {
                    if (PyErr_Occurred()) return -1;
                    continue;
                }
                PyObject *items = PyTuple_GET_ITEM(lst, 1);
                for (Py_ssize_t q = 0; q < PyTuple_GET_SIZE(items); q++) {
                    int e2 = same(PyTuple_GET_ITEM(items, q), i);
                    if (e2 < 0) return -1;
                    if (e2 && count++ == 0) at = p;
                }
            }
        }
        int define = count == 0;
        if (count == 1) {
            PyObject *pos = PyLong_FromSsize_t(at);
            if (pos == NULL) return -1;
            define = PySet_Contains(outs, pos);
            Py_DECREF(pos);
            if (define < 0) return -1;
        }
        if (define && add_use(defines, first_define, i, pc) < 0) return -1;
    }
    return 1;
}

static PyObject *scan(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *instructions, *rets, *lists, *ops, *kernel_t, *move_t, *free_t;
    if (!PyArg_ParseTuple(args, "O!O!O!O!OOO", &PyList_Type, &instructions, &PyList_Type, &rets, &PyDict_Type, &lists,
                          &PyList_Type, &ops, &kernel_t, &move_t, &free_t))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(instructions);
    if (PyList_GET_SIZE(rets) != n) {
        PyErr_SetString(PyExc_ValueError, "scan: rets and instructions differ in length");
        return NULL;
    }
    const int have_lists = PyDict_GET_SIZE(lists) > 0;
    PyObject *mentions = PyDict_New(), *writers = PyDict_New(), *defines = PyDict_New();
    PyObject *fm = PyDict_New(), *fw = PyDict_New(), *fd = PyDict_New(), *slow = PyList_New(0);
    Named *named = PyMem_Malloc(sizeof(Named)), *wrote = PyMem_Malloc(sizeof(Named));
    PyObject *s_args = PyUnicode_InternFromString("args"), *s_op = PyUnicode_InternFromString("op_index");
    PyObject *s_from = PyUnicode_InternFromString("move_from"), *s_to = PyUnicode_InternFromString("move_to");
    PyObject *s_value = PyUnicode_InternFromString("value_index");
    PyObject *pc_obj = NULL, *a_args = NULL, *tmp = NULL;
    int ok = mentions && writers && defines && fm && fw && fd && slow && named && wrote && s_args && s_op && s_from &&
             s_to && s_value;
    for (Py_ssize_t pc = 0; ok && pc < n; pc++) {
        PyObject *a = PyList_GET_ITEM(instructions, pc);
        PyTypeObject *t = Py_TYPE(a);
        int handled = 0, r1 = 0, r2 = 0;
        pc_obj = PyLong_FromSsize_t(pc);
        if (pc_obj == NULL) { ok = 0; break; }
        if ((PyObject *)t == kernel_t) {
            a_args = PyObject_GetAttr(a, s_args);
            PyObject *opi = a_args ? PyObject_GetAttr(a, s_op) : NULL;
            PyObject *r = PyList_GET_ITEM(rets, pc);
            PyObject *out = (r != Py_None && PyTuple_Check(r) && PyTuple_GET_SIZE(r)) ? r : a_args;
            Py_ssize_t oi = opi && PyLong_CheckExact(opi) ? PyLong_AsSsize_t(opi) : -1;
            Py_XDECREF(opi);
            if (a_args == NULL || PyErr_Occurred()) { ok = 0; break; }
            if (PyTuple_Check(a_args) && PyTuple_Check(out) && oi >= 0 && oi < PyList_GET_SIZE(ops) &&
                (r1 = expand(a_args, lists, have_lists, named)) == 1 && (r2 = expand(out, lists, have_lists, wrote)) == 1) {
                PyObject *op = PyList_GET_ITEM(ops, oi);
                handled = op == Py_None || (PyTuple_Check(op) && PyTuple_GET_SIZE(op) == 2 &&
                                            PyLong_Check(PyTuple_GET_ITEM(op, 0)) && PyAnySet_Check(PyTuple_GET_ITEM(op, 1)));
                if (handled && op != Py_None) {
                    Py_ssize_t np_ = PyLong_AsSsize_t(PyTuple_GET_ITEM(op, 0));
                    if (np_ < 0 && PyErr_Occurred()) { ok = 0; break; }
                    if (np_ < 0) {
                        handled = 0; /* not a parameter count: the caller's loop decides */
                    } else if (PyTuple_GET_SIZE(a_args) > np_) {
                        tmp = PyTuple_GetSlice(a_args, 0, np_);
                        if (tmp == NULL || kernel_defines(tmp, PyTuple_GET_ITEM(op, 1), wrote, lists, have_lists, defines, fd,
                                                          pc_obj) < 0) { ok = 0; break; }
                        Py_CLEAR(tmp);
                    }
                }
            }
            Py_CLEAR(a_args);
        } else if ((PyObject *)t == move_t || (PyObject *)t == free_t) {
            PyObject *x = PyObject_GetAttr(a, (PyObject *)t == move_t ? s_from : s_value);
            PyObject *y = (PyObject *)t == move_t && x ? PyObject_GetAttr(a, s_to) : NULL;
            if (x == NULL || ((PyObject *)t == move_t && y == NULL)) { Py_XDECREF(x); ok = 0; break; }
            a_args = y ? PyTuple_Pack(2, x, y) : PyTuple_Pack(1, x);
            Py_DECREF(x);
            Py_XDECREF(y);
            if (a_args == NULL) { ok = 0; break; }
            if ((r1 = expand(a_args, lists, have_lists, named)) == 1) {
                *wrote = *named;  /* a move or free names and writes the same values */
                handled = 1;
            }
            Py_CLEAR(a_args);
        }
        if (r1 < 0 || r2 < 0) { ok = 0; break; }
        if (!handled) {
            ok = PyList_Append(slow, pc_obj) == 0;
        } else {
            for (Py_ssize_t k = 0; ok && k < named->n; k++) ok = add_use(mentions, fm, named->obj[k], pc_obj) == 0;
            for (Py_ssize_t k = 0; ok && k < wrote->n; k++) ok = add_use(writers, fw, wrote->obj[k], pc_obj) == 0;
        }
        Py_CLEAR(pc_obj);
    }
    Py_XDECREF(pc_obj);
    Py_XDECREF(a_args);
    Py_XDECREF(tmp);
    PyMem_Free(named);
    PyMem_Free(wrote);
    Py_XDECREF(s_args); Py_XDECREF(s_op); Py_XDECREF(s_from); Py_XDECREF(s_to); Py_XDECREF(s_value);
    PyObject *res = ok ? Py_BuildValue("(OOOOOOO)", mentions, writers, defines, fm, fw, fd, slow) : NULL;
    Py_XDECREF(mentions); Py_XDECREF(writers); Py_XDECREF(defines);
    Py_XDECREF(fm); Py_XDECREF(fw); Py_XDECREF(fd); Py_XDECREF(slow);
    return res;
}

/* ---- _Storage (orchestra/runtime/_optimize.py) ------------------------------------------- */

/* *v = o when o is an exact int that fits in 64 bits: 1; 0 when it is not (no error set); -1
 * on an error. */
static int get_i64(PyObject *o, int64_t *v) {
    if (!PyLong_CheckExact(o)) return 0;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow) return 0;
    if (x == -1 && PyErr_Occurred()) return -1;
    *v = (int64_t)x;
    return 1;
}

/* A growing array ``p`` of *cap items of ``size`` bytes, n in use, with room for one more:
 * ``p`` itself while there is room, else it doubled (first 64), the byte count checked before
 * it is asked for; NULL with MemoryError set (``p`` is then still the caller's to free). */
static void *grow_for_one(void *p, Py_ssize_t n, Py_ssize_t *cap, size_t size) {
    if (n < *cap) return p;
    Py_ssize_t want = *cap ? *cap : 64;
    if (*cap) {
        if (want > PY_SSIZE_T_MAX / 2 / (Py_ssize_t)size) {
            PyErr_NoMemory();
            return NULL;
        }
        want *= 2;
    }
    void *q = PyMem_Realloc(p, (size_t)want * size);
    if (q == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    *cap = want;
    return q;
}

/* A growing array of int64. */
typedef struct {
    int64_t *p;
    Py_ssize_t n, cap;
} I64s;

static int i64s_push(I64s *b, int64_t v) {
    int64_t *q = grow_for_one(b->p, b->n, &b->cap, sizeof(int64_t));
    if (q == NULL) return -1;
    b->p = q;
    b->p[b->n++] = v;
    return 0;
}

static PyObject *i64s_bytes(const I64s *b) {
    return PyBytes_FromStringAndSize(b->n ? (const char *)b->p : "", b->n * (Py_ssize_t)sizeof(int64_t));
}

/* An entry of _Storage.by_mem: (first byte, end byte, value), exact ints of 64 bits. 1, 0 (not
 * of that shape), -1 error. */
static int get_entry(PyObject *e, int64_t *lo, int64_t *hi, int64_t *value) {
    if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != 3) return 0;
    int r = get_i64(PyTuple_GET_ITEM(e, 0), lo);
    if (r == 1) r = get_i64(PyTuple_GET_ITEM(e, 1), hi);
    if (r == 1) r = get_i64(PyTuple_GET_ITEM(e, 2), value);
    return r;
}

/* A 1-D contiguous buffer of 8-byte signed ints (numpy int64: format 'l' or 'q') when
 * ``boolean`` is 0, of 1-byte bools (format '?') when it is 1. 1, 0 (another kind of object),
 * -1 error; on 1 the caller releases ``view``. */
static int get_column(PyObject *o, Py_buffer *view, int boolean) {
    if (!PyObject_CheckBuffer(o)) return 0;
    if (PyObject_GetBuffer(o, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        if (PyErr_ExceptionMatches(PyExc_BufferError) || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=') f++;
    int ok = view->ndim == 1 && f[0] != 0 && f[1] == 0 &&
             (boolean ? view->itemsize == 1 && f[0] == '?'
                      : view->itemsize == 8 && (f[0] == 'q' || (f[0] == 'l' && sizeof(long) == 8)));
    if (!ok) {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* layout(slots) -> (regions, by_mem), _Storage.__init__'s loop over the planned values:
 * regions[i] = (memory_id, offset, offset + size) for each slot that is not None, with size
 * = slot.dtype.itemsize * slot.capacity, and by_mem[memory_id] the (offset, offset + size, i)
 * of those of a positive size, in value order. The arithmetic is Python's (any int), and an
 * attribute missing raises as the Python loop would. None when slots is not a list. */
static PyObject *layout(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *slots;
    if (!PyArg_ParseTuple(args, "O", &slots)) return NULL;
    if (!PyList_CheckExact(slots)) Py_RETURN_NONE;
    PyObject *regions = PyDict_New(), *by_mem = PyDict_New(), *zero = PyLong_FromLong(0);
    PyObject *s_dtype = PyUnicode_InternFromString("dtype"), *s_itemsize = PyUnicode_InternFromString("itemsize");
    PyObject *s_capacity = PyUnicode_InternFromString("capacity"), *s_memory = PyUnicode_InternFromString("memory_id");
    PyObject *s_offset = PyUnicode_InternFromString("offset");
    int ok = regions && by_mem && zero && s_dtype && s_itemsize && s_capacity && s_memory && s_offset;
    for (Py_ssize_t i = 0; ok && i < PyList_GET_SIZE(slots); i++) {
        PyObject *slot = PyList_GET_ITEM(slots, i);
        if (slot == Py_None) continue;
        Py_INCREF(slot);  /* (the attribute lookups below may run Python code) */
        PyObject *dtype = NULL, *itemsize = NULL, *capacity = NULL, *size = NULL, *memory = NULL, *offset = NULL;
        PyObject *end = NULL, *index = NULL, *region = NULL, *entry = NULL;
        ok = (dtype = PyObject_GetAttr(slot, s_dtype)) && (itemsize = PyObject_GetAttr(dtype, s_itemsize)) &&
             (capacity = PyObject_GetAttr(slot, s_capacity)) && (size = PyNumber_Multiply(itemsize, capacity)) &&
             (memory = PyObject_GetAttr(slot, s_memory)) && (offset = PyObject_GetAttr(slot, s_offset)) &&
             (end = PyNumber_Add(offset, size)) && (index = PyLong_FromSsize_t(i)) &&
             (region = PyTuple_Pack(3, memory, offset, end)) && PyDict_SetItem(regions, index, region) == 0;
        int positive = ok ? PyObject_RichCompareBool(size, zero, Py_GT) : 0;
        if (positive < 0) ok = 0;
        if (ok && positive) {
            PyObject *list = PyDict_GetItemWithError(by_mem, memory);
            if (list == NULL && !PyErr_Occurred()) {
                list = PyList_New(0);
                ok = list != NULL && PyDict_SetItem(by_mem, memory, list) == 0;
                Py_XDECREF(list);  /* (by_mem holds it) */
            }
            ok = ok && list != NULL && (entry = PyTuple_Pack(3, offset, end, index)) && PyList_Append(list, entry) == 0;
        }
        Py_XDECREF(dtype); Py_XDECREF(itemsize); Py_XDECREF(capacity); Py_XDECREF(size); Py_XDECREF(memory);
        Py_XDECREF(offset); Py_XDECREF(end); Py_XDECREF(index); Py_XDECREF(region); Py_XDECREF(entry);
        Py_DECREF(slot);
    }
    Py_XDECREF(zero); Py_XDECREF(s_dtype); Py_XDECREF(s_itemsize); Py_XDECREF(s_capacity); Py_XDECREF(s_memory);
    Py_XDECREF(s_offset);
    PyObject *res = ok ? PyTuple_Pack(2, regions, by_mem) : NULL;
    Py_XDECREF(regions);
    Py_XDECREF(by_mem);
    return res;
}

/* writes_at(writers, n) -> [values instruction pc may write, for pc in range(n)], in the order
 * the Python loop appends them (writers' order, then each set's). None when writers is not a
 * dict of sets of ints in range(n). */
static PyObject *writes_at(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *writers;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "On", &writers, &n)) return NULL;
    if (!PyDict_CheckExact(writers) || n < 0) Py_RETURN_NONE;
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t pc = 0; pc < n; pc++) {
        PyObject *l = PyList_New(0);
        if (l == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, pc, l);
    }
    Py_ssize_t pos = 0;
    PyObject *i, *pcs;
    while (PyDict_Next(writers, &pos, &i, &pcs)) {
        if (!PySet_CheckExact(pcs) && !PyFrozenSet_CheckExact(pcs)) goto other;
        Py_INCREF(i);
        Py_INCREF(pcs);
        PyObject *it = PyObject_GetIter(pcs), *pc;
        int bad = it == NULL, other = 0;
        while (!bad && !other && (pc = PyIter_Next(it)) != NULL) {
            int64_t k = 0;
            int r = get_i64(pc, &k);
            Py_DECREF(pc);
            if (r < 0) bad = 1;
            else if (r == 0 || k < 0 || k >= n) other = 1;
            else bad = PyList_Append(PyList_GET_ITEM(out, k), i) < 0;
        }
        bad = bad || PyErr_Occurred() != NULL;
        Py_XDECREF(it);
        Py_DECREF(pcs);
        Py_DECREF(i);
        if (bad) {
            Py_DECREF(out);
            return NULL;
        }
        if (other) goto other;
    }
    return out;
other:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

/* reads(mentions, defines, outputs, n) -> _Storage.reads(): value -> mentions[value] less
 * defines[value] (the same objects and types as Python's ``-``), then each output's with n
 * added (``|``). None when mentions or defines is not a dict, or outputs not a set. */
static PyObject *reads(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *mentions, *defines, *outputs, *n;
    if (!PyArg_ParseTuple(args, "OOOO", &mentions, &defines, &outputs, &n)) return NULL;
    if (!PyDict_CheckExact(mentions) || !PyDict_CheckExact(defines) || !PyAnySet_CheckExact(outputs)) Py_RETURN_NONE;
    /* A copy of mentions (its order, its sets), then the defined values' replaced in place: most
     * values are defined by no instruction, and a dict's copy is one pass over its table. */
    PyObject *out = PyDict_Copy(mentions);
    if (out == NULL) return NULL;
    Py_ssize_t pos = 0;
    PyObject *i, *d;
    while (PyDict_Next(defines, &pos, &i, &d)) {
        Py_INCREF(i);
        Py_INCREF(d);
        PyObject *ms = PyDict_GetItemWithError(mentions, i), *v = NULL;
        int bad = ms == NULL && PyErr_Occurred();
        if (ms != NULL) {
            Py_INCREF(ms);
            v = PyNumber_Subtract(ms, d);
            bad = v == NULL || PyDict_SetItem(out, i, v) < 0;
            Py_XDECREF(v);
            Py_DECREF(ms);
        }
        Py_DECREF(d);
        Py_DECREF(i);
        if (bad) {
            Py_DECREF(out);
            return NULL;
        }
    }
    PyObject *end = NULL, *items = PyTuple_Pack(1, n);
    if (items != NULL) end = PyFrozenSet_New(items);
    Py_XDECREF(items);
    PyObject *it = end ? PyObject_GetIter(outputs) : NULL;
    if (it == NULL) {
        Py_XDECREF(end);
        Py_DECREF(out);
        return NULL;
    }
    int bad = 0;
    while (!bad && (i = PyIter_Next(it)) != NULL) {
        PyObject *cur = PyDict_GetItemWithError(out, i), *v = NULL;
        if (cur != NULL) {
            v = PyNumber_Or(cur, end);
        } else if (!PyErr_Occurred()) {
            PyObject *empty = PyFrozenSet_New(NULL);
            v = empty ? PyNumber_Or(empty, end) : NULL;
            Py_XDECREF(empty);
        }
        bad = v == NULL || PyDict_SetItem(out, i, v) < 0;
        Py_XDECREF(v);
        Py_DECREF(i);
    }
    bad = bad || PyErr_Occurred() != NULL;
    Py_DECREF(it);
    Py_DECREF(end);
    if (bad) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* mem_reads(entries, reads) -> (positions, first bytes, end bytes, values): _Storage._mem_reads
 * of one memory, ``entries`` its by_mem list; the first three as int64 bytes, the values a
 * list. Each entry's reads in the order its set iterates, as the Python loop extends them. None
 * when reads is not a dict, an entry or a read position not as _Storage makes them. */
static PyObject *mem_reads(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *entries, *rd;
    if (!PyArg_ParseTuple(args, "OO", &entries, &rd)) return NULL;
    if (!PyList_CheckExact(entries) || !PyDict_CheckExact(rd)) Py_RETURN_NONE;
    I64s pos = {0}, lo = {0}, hi = {0};
    PyObject *val = PyList_New(0), *res = NULL;
    int state = val ? 1 : -1; /* 1 going on, 0 another shape, -1 error */
    for (Py_ssize_t k = 0; state == 1 && k < PyList_GET_SIZE(entries); k++) {
        PyObject *e = PyList_GET_ITEM(entries, k);
        int64_t a_lo, a_hi, a;
        state = get_entry(e, &a_lo, &a_hi, &a);
        if (state != 1) break;
        PyObject *value = PyTuple_GET_ITEM(e, 2);
        PyObject *ps = PyDict_GetItemWithError(rd, value);
        if (ps == NULL) {
            if (PyErr_Occurred()) state = -1;
            continue;
        }
        if (!PySet_CheckExact(ps) && !PyFrozenSet_CheckExact(ps)) {
            state = 0;
            break;
        }
        Py_INCREF(ps);
        PyObject *it = PyObject_GetIter(ps), *p;
        if (it == NULL) state = -1;
        while (state == 1 && (p = PyIter_Next(it)) != NULL) {
            int64_t v = 0;
            state = get_i64(p, &v);
            if (state == 1) {
                if (i64s_push(&pos, v) < 0 || i64s_push(&lo, a_lo) < 0 || i64s_push(&hi, a_hi) < 0 ||
                    PyList_Append(val, value) < 0)
                    state = -1;
            }
            Py_DECREF(p);
        }
        if (state == 1 && PyErr_Occurred()) state = -1;
        Py_XDECREF(it);
        Py_DECREF(ps);
    }
    if (state == 1) {
        PyObject *b0 = i64s_bytes(&pos), *b1 = i64s_bytes(&lo), *b2 = i64s_bytes(&hi);
        res = b0 && b1 && b2 ? PyTuple_Pack(4, b0, b1, b2, val) : NULL;
        Py_XDECREF(b0); Py_XDECREF(b1); Py_XDECREF(b2);
    } else if (state == 0) {
        res = Py_NewRef(Py_None);
    }
    PyMem_Free(pos.p);
    PyMem_Free(lo.p);
    PyMem_Free(hi.p);
    Py_XDECREF(val);
    return res;
}

/* A write of all of a region's bytes: (first byte, end byte, position). */
typedef struct {
    int64_t lo, hi, w;
} Write;

static int write_cmp(const void *a, const void *b) {
    const Write *x = a, *y = b;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    if (x->hi != y->hi) return x->hi < y->hi ? -1 : 1;
    return x->w < y->w ? -1 : x->w > y->w;
}

/* A growing array of Writes. */
typedef struct {
    Write *p;
    Py_ssize_t n, cap;
} Writes;

static int writes_push(Writes *b, Write v) {
    Write *q = grow_for_one(b->p, b->n, &b->cap, sizeof(Write));
    if (q == NULL) return -1;
    b->p = q;
    b->p[b->n++] = v;
    return 0;
}

/* Adds (lo, hi, w) unless (w, value) is in dropped. 1, 0 (w not an int of 64 bits), -1. */
static int add_write(Writes *ws, int64_t lo, int64_t hi, PyObject *w, PyObject *value, PyObject *dropped) {
    int64_t wv;
    int r = get_i64(w, &wv);
    if (r != 1) return r;
    PyObject *key = PyTuple_Pack(2, w, value);
    if (key == NULL) return -1;
    int gone = PySet_Contains(dropped, key);
    Py_DECREF(key);
    if (gone < 0) return -1;
    if (!gone && writes_push(ws, (Write){lo, hi, wv}) < 0) return -1;
    return 1;
}

/* own_writes(entries, rp, rlo, rhi, slots, defines, inputs, dropped) -> (own, has):
 * _Storage._own_writes of one memory. ``entries`` is its by_mem list, rp / rlo / rhi the
 * position and bytes of each read (_mem_reads' int64 arrays); the whole writes are
 * _Storage.whole_writes' (a static planned value's defining instructions, and -1 for an
 * input), less those in dropped. ``own`` (int64 bytes) is per read the last such write of its
 * bytes before it, wrapping (-2: none), ``has`` (bool bytes) whether there is one. None when
 * an input is not of the shape _Storage makes. */
static PyObject *own_writes(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *entries, *rp_o, *rlo_o, *rhi_o, *slots, *defines, *inputs, *dropped;
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &entries, &rp_o, &rlo_o, &rhi_o, &slots, &defines, &inputs, &dropped))
        return NULL;
    if (!PyList_CheckExact(entries) || !PyList_CheckExact(slots) || !PyDict_CheckExact(defines) ||
        !PyAnySet_CheckExact(inputs) || !PyAnySet_CheckExact(dropped))
        Py_RETURN_NONE;
    Py_buffer cols[3];
    int got = 0, state = 1;
    PyObject *objs[3] = {rp_o, rlo_o, rhi_o};
    for (; got < 3; got++) {
        state = get_column(objs[got], &cols[got], 0);
        if (state != 1) break;
    }
    Py_ssize_t nr = state == 1 ? cols[0].len / 8 : 0;
    if (state == 1 && (cols[1].len / 8 != nr || cols[2].len / 8 != nr)) state = 0;
    Writes ws = {0};
    PyObject *s_dynamic = state == 1 ? PyUnicode_InternFromString("dynamic") : NULL, *minus1 = NULL;
    if (state == 1 && (s_dynamic == NULL || (minus1 = PyLong_FromLong(-1)) == NULL)) state = -1;
    /* The whole writes of the memory's values (whole_writes), less the dropped. */
    for (Py_ssize_t k = 0; state == 1 && k < PyList_GET_SIZE(entries); k++) {
        PyObject *e = PyList_GET_ITEM(entries, k);
        int64_t lo, hi, d;
        state = get_entry(e, &lo, &hi, &d);
        if (state != 1) break;
        if (d < 0 || d >= PyList_GET_SIZE(slots)) {
            state = 0;
            break;
        }
        PyObject *slot = PyList_GET_ITEM(slots, d), *value = PyTuple_GET_ITEM(e, 2);
        if (slot == Py_None) continue;
        Py_INCREF(slot);
        PyObject *dyn = PyObject_GetAttr(slot, s_dynamic);
        Py_DECREF(slot);
        int dynamic = dyn ? PyObject_IsTrue(dyn) : -1;
        Py_XDECREF(dyn);
        if (dynamic) {
            if (dynamic < 0) state = -1;
            continue;
        }
        PyObject *ds = PyDict_GetItemWithError(defines, value);
        if (ds != NULL) {
            if (!PySet_CheckExact(ds) && !PyFrozenSet_CheckExact(ds)) {
                state = 0;
                break;
            }
            Py_INCREF(ds);
            PyObject *it = PyObject_GetIter(ds), *w;
            if (it == NULL) state = -1;
            while (state == 1 && (w = PyIter_Next(it)) != NULL) {
                state = add_write(&ws, lo, hi, w, value, dropped);
                Py_DECREF(w);
            }
            if (state == 1 && PyErr_Occurred()) state = -1;
            Py_XDECREF(it);
            Py_DECREF(ds);
        } else if (PyErr_Occurred()) {
            state = -1;
        }
        if (state != 1) break;
        int input = PySet_Contains(inputs, value);
        if (input < 0) state = -1;
        else if (input) state = add_write(&ws, lo, hi, minus1, value, dropped);
    }
    PyObject *res = NULL;
    if (state == 1) {
        /* Sorted by region then position, each (region, position) once: a region's writes
         * are a run, searched as bisect searches its sorted list. */
        if (ws.n > 1) qsort(ws.p, (size_t)ws.n, sizeof(Write), write_cmp);
        Py_ssize_t u = 0;
        for (Py_ssize_t k = 0; k < ws.n; k++)
            if (!u || write_cmp(&ws.p[u - 1], &ws.p[k]) != 0) ws.p[u++] = ws.p[k];
        ws.n = u;
        const int64_t *rp = cols[0].buf, *rlo = cols[1].buf, *rhi = cols[2].buf;
        PyObject *own_b = PyBytes_FromStringAndSize(NULL, nr * (Py_ssize_t)sizeof(int64_t));
        PyObject *has_b = PyBytes_FromStringAndSize(NULL, nr);
        if (own_b && has_b) {
            int64_t *own = (int64_t *)PyBytes_AS_STRING(own_b);
            char *has = PyBytes_AS_STRING(has_b);
            for (Py_ssize_t r = 0; r < nr; r++) {
                /* The run of region (rlo, rhi): [a, b). */
                Py_ssize_t a = 0, b = ws.n;
                while (a < b) {
                    Py_ssize_t mid = a + (b - a) / 2;
                    const Write *x = &ws.p[mid];
                    if (x->lo < rlo[r] || (x->lo == rlo[r] && x->hi < rhi[r])) a = mid + 1;
                    else b = mid;
                }
                b = a;
                while (b < ws.n && ws.p[b].lo == rlo[r] && ws.p[b].hi == rhi[r]) b++;
                /* bisect_left of rp[r] in the run */
                Py_ssize_t lo_k = a, hi_k = b;
                while (lo_k < hi_k) {
                    Py_ssize_t mid = lo_k + (hi_k - lo_k) / 2;
                    if (ws.p[mid].w < rp[r]) lo_k = mid + 1;
                    else hi_k = mid;
                }
                int found = 0;
                int64_t w = -2;
                if (a < b) {
                    if (lo_k > a) {
                        w = ws.p[lo_k - 1].w;  /* the last one before the read */
                        found = 1;
                    } else if (ws.p[b - 1].w != rp[r]) {
                        w = ws.p[b - 1].w;  /* none before: the last one of the previous execute */
                        found = 1;
                    }
                }
                own[r] = found ? w : -2;
                has[r] = (char)found;
            }
            res = PyTuple_Pack(2, own_b, has_b);
        }
        Py_XDECREF(own_b);
        Py_XDECREF(has_b);
    } else if (state == 0) {
        res = Py_NewRef(Py_None);
    }
    for (int k = 0; k < got; k++) PyBuffer_Release(&cols[k]);
    PyMem_Free(ws.p);
    Py_XDECREF(s_dynamic);
    Py_XDECREF(minus1);
    return res;
}

/* group(queries, regions, by_mem, numpy_from) -> prefetch_covered's questions by memory:
 * memory id -> [(first byte, end byte, pc)] of each (value, pc) in queries whose value is
 * planned, of a positive size, in a memory of more than numpy_from values, in the order asked.
 * None when queries is not a list of pairs, or a region, memory or count not as _Storage makes
 * them. */
static PyObject *group(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *queries, *regions, *by_mem, *numpy_from_o;
    if (!PyArg_ParseTuple(args, "OOOO", &queries, &regions, &by_mem, &numpy_from_o)) return NULL;
    int64_t numpy_from = 0;
    int r = get_i64(numpy_from_o, &numpy_from);
    if (r < 0) return NULL;
    if (!r || !PyList_CheckExact(queries) || !PyDict_CheckExact(regions) || !PyDict_CheckExact(by_mem)) Py_RETURN_NONE;
    PyObject *out = PyDict_New();
    if (out == NULL) return NULL;
    int state = 1;
    for (Py_ssize_t k = 0; state == 1 && k < PyList_GET_SIZE(queries); k++) {
        PyObject *q = PyList_GET_ITEM(queries, k);
        if (!PyTuple_CheckExact(q) || PyTuple_GET_SIZE(q) != 2) {
            state = 0;
            break;
        }
        PyObject *reg = PyDict_GetItemWithError(regions, PyTuple_GET_ITEM(q, 0));
        if (reg == NULL) {
            if (PyErr_Occurred()) state = -1;
            continue;
        }
        int64_t m, lo, hi;
        if (!PyTuple_CheckExact(reg) || PyTuple_GET_SIZE(reg) != 3) {
            state = 0;
            break;
        }
        state = get_i64(PyTuple_GET_ITEM(reg, 0), &m);
        if (state == 1) state = get_i64(PyTuple_GET_ITEM(reg, 1), &lo);
        if (state == 1) state = get_i64(PyTuple_GET_ITEM(reg, 2), &hi);
        if (state != 1 || hi <= lo) continue;
        PyObject *mem = PyTuple_GET_ITEM(reg, 0), *values = PyDict_GetItemWithError(by_mem, mem);
        if (values == NULL && PyErr_Occurred()) {
            state = -1;
            break;
        }
        if (values != NULL && !PyList_CheckExact(values)) {
            state = 0;
            break;
        }
        if ((values ? PyList_GET_SIZE(values) : 0) <= numpy_from) continue;  /* (none there: len(()) is 0) */
        PyObject *qs = PyDict_GetItemWithError(out, mem);
        if (qs == NULL) {
            if (PyErr_Occurred() || (qs = PyList_New(0)) == NULL) {
                state = -1;
                break;
            }
            int bad = PyDict_SetItem(out, mem, qs) < 0;
            Py_DECREF(qs);  /* (out holds it) */
            if (bad) {
                state = -1;
                break;
            }
        }
        PyObject *t = PyTuple_Pack(3, PyTuple_GET_ITEM(reg, 1), PyTuple_GET_ITEM(reg, 2), PyTuple_GET_ITEM(q, 1));
        if (t == NULL || PyList_Append(qs, t) < 0) state = -1;
        Py_XDECREF(t);
    }
    if (state == 1) return out;
    Py_DECREF(out);
    if (state < 0) return NULL;
    Py_RETURN_NONE;
}

/* Python's (and numpy's) a % b for b > 0. */
static inline int64_t floor_mod(int64_t a, int64_t b) {
    int64_t r = a % b;
    return r < 0 ? r + b : r;
}

/* Values as large as this never occur as positions; past them the caller's numpy runs. */
#define POSITION_LIMIT ((int64_t)1 << 60)

/* cover(known, m, qs, rp, rlo, rhi, own, has, size): prefetch_covered's test for memory m.
 * qs: list of (first byte, end byte, pc); rp / rlo / rhi / own / has: the _mem_reads and
 * _own_writes arrays. Adds (m, first byte, end byte, pc) to the set known for each query that
 * every read of its bytes sees its own last write come strictly between pc and the read
 * (going forward from pc, wrapping at size). True when done; False, with known untouched,
 * when an input is not of the shape expected (the caller's numpy test then runs). */
static PyObject *cover(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *known, *m, *qs, *cols_o[5], *size_o;
    int64_t size = 0;
    if (!PyArg_ParseTuple(args, "OOOOOOOOO", &known, &m, &qs, &cols_o[0], &cols_o[1], &cols_o[2], &cols_o[3],
                          &cols_o[4], &size_o))
        return NULL;
    int r = get_i64(size_o, &size);
    if (r < 0) return NULL;
    if (!r || !PySet_CheckExact(known) || !PyList_CheckExact(qs) || size <= 0 || size > POSITION_LIMIT) Py_RETURN_FALSE;
    Py_buffer cols[5];
    int got = 0, state = 1;
    for (; got < 5; got++) {
        state = get_column(cols_o[got], &cols[got], got == 4);
        if (state != 1) break;
    }
    Py_ssize_t nr = state == 1 ? cols[0].len / 8 : 0;
    for (int k = 1; state == 1 && k < 5; k++)
        if (cols[k].len / cols[k].itemsize != nr) state = 0;
    int64_t *q = NULL;
    Py_ssize_t nq = PyList_GET_SIZE(qs);
    if (state == 1) {
        /* The queries, and that no position is so large the arithmetic could overflow. */
        if (nq > PY_SSIZE_T_MAX / 3 / (Py_ssize_t)sizeof(int64_t)) state = 0;
        else if ((q = PyMem_Malloc((size_t)(nq ? nq : 1) * 3 * sizeof(int64_t))) == NULL) {
            PyErr_NoMemory();
            state = -1;
        }
        for (Py_ssize_t k = 0; state == 1 && k < nq; k++) {
            PyObject *t = PyList_GET_ITEM(qs, k);
            if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 3) {
                state = 0;
                break;
            }
            for (int j = 0; state == 1 && j < 3; j++) state = get_i64(PyTuple_GET_ITEM(t, j), &q[3 * k + j]);
            if (state == 1 && (q[3 * k + 2] <= -POSITION_LIMIT || q[3 * k + 2] >= POSITION_LIMIT)) state = 0;
        }
        const int64_t *rp = cols[0].buf, *own = cols[3].buf;
        for (Py_ssize_t r = 0; state == 1 && r < nr; r++)
            if (rp[r] <= -POSITION_LIMIT || rp[r] >= POSITION_LIMIT || own[r] <= -POSITION_LIMIT ||
                own[r] >= POSITION_LIMIT)
                state = 0;
    }
    if (state == 1) {
        const int64_t *rp = cols[0].buf, *rlo = cols[1].buf, *rhi = cols[2].buf, *own = cols[3].buf;
        const char *has = cols[4].buf;
        for (Py_ssize_t k = 0; state == 1 && k < nq; k++) {
            const int64_t lo = q[3 * k], hi = q[3 * k + 1], pc = q[3 * k + 2];
            int covered = 1;
            for (Py_ssize_t r = 0; covered && r < nr; r++) {
                if (!(rlo[r] < hi && rhi[r] > lo)) continue;
                const int64_t kr = floor_mod(rp[r] - (pc + 1), size) + 1;  /* distance from pc, 1..size */
                const int64_t ko = floor_mod(own[r] - pc, size);
                covered = has[r] && ko > 0 && ko < kr;
            }
            if (!covered) continue;
            PyObject *t = PyList_GET_ITEM(qs, k);
            PyObject *key = PyTuple_Pack(4, m, PyTuple_GET_ITEM(t, 0), PyTuple_GET_ITEM(t, 1), PyTuple_GET_ITEM(t, 2));
            if (key == NULL || PySet_Add(known, key) < 0) state = -1;
            Py_XDECREF(key);
        }
    }
    for (int k = 0; k < got; k++) PyBuffer_Release(&cols[k]);
    PyMem_Free(q);
    if (state < 0) return NULL;
    return PyBool_FromLong(state == 1);
}

/* ---- _Matcher (orchestra/runtime/_optimize.py) ------------------------------------------- */

/* What the matchers read of a plan: its values (EValue objects, ``.val`` the payload), the
 * literals' Python objects (CompiledPlan.template), the values some instruction writes, the
 * list values ((optional, items)), scalar type -> numpy dtype, and the payload types. */
typedef struct {
    PyObject *values, *template_, *written, *lists, *to_numpy, *tensor_t, *int_t, *null_t;
    PyObject *s_val, *s_sizes, *s_dyn, *s_st;
} Plan;

/* A matcher's answer left to the Python code (the input is not of the shape it expects). */
#define ASK 2
/* Elements of one int list or shape handled here. */
#define MAX_DIMS 64

/* value index i as a C index into the plan's values: 1, ASK (not an exact int in range), -1. */
static int value_index(const Plan *p, PyObject *i, Py_ssize_t *k) {
    int64_t v = 0;
    int r = get_i64(i, &v);
    if (r != 1) return r < 0 ? -1 : ASK;
    if (v < 0 || v >= PyTuple_GET_SIZE(p->values) || v >= PyList_GET_SIZE(p->template_)) return ASK;
    *k = (Py_ssize_t)v;
    return 1;
}

/* *val = values[i].val (a new reference): 1, ASK, -1. */
static int payload(const Plan *p, PyObject *i, PyObject **val) {
    Py_ssize_t k = 0;
    int r = value_index(p, i, &k);
    if (r != 1) return r;
    *val = PyObject_GetAttr(PyTuple_GET_ITEM(p->values, k), p->s_val);
    return *val ? 1 : -1;
}

/* Whether val is of payload type t: 1 exactly, 0 not at all, ASK (a subclass), -1. */
static int payload_is(PyObject *val, PyObject *t) {
    if ((PyObject *)Py_TYPE(val) == t) return 1;
    int r = PyObject_IsInstance(val, t);
    return r < 0 ? -1 : r ? ASK : 0;
}

/* _Matcher.static_tensor(i): 1 with *dt (borrowed from to_numpy) and *sizes (a new reference,
 * a tuple of exact non-negative ints of 64 bits, at most MAX_DIMS), 0 for None, ASK, -1. */
static int static_tensor(const Plan *p, PyObject *i, PyObject **dt, PyObject **sizes) {
    PyObject *val = NULL, *dyn = NULL, *st = NULL, *sz = NULL;
    int r = payload(p, i, &val);
    if (r == 1) r = payload_is(val, p->tensor_t);
    if (r == 1) r = (dyn = PyObject_GetAttr(val, p->s_dyn)) ? 1 : -1;
    if (r == 1) {  /* shape_dynamism != 0: None */
        if (!PyLong_Check(dyn)) {
            r = ASK;
        } else {
            int overflow = 0;
            long long d = PyLong_AsLongLongAndOverflow(dyn, &overflow);
            if (d == -1 && PyErr_Occurred()) r = -1;
            else if (overflow || d != 0) r = 0;
        }
    }
    if (r == 1) r = (st = PyObject_GetAttr(val, p->s_st)) ? 1 : -1;
    if (r == 1) {
        *dt = PyLong_Check(st) ? PyDict_GetItemWithError(p->to_numpy, st) : NULL;
        r = *dt ? 1 : PyErr_Occurred() ? -1 : 0;
    }
    if (r == 1) r = (sz = PyObject_GetAttr(val, p->s_sizes)) ? 1 : -1;
    if (r == 1) {
        if (!PyTuple_CheckExact(sz) || PyTuple_GET_SIZE(sz) > MAX_DIMS) r = ASK;
        for (Py_ssize_t k = 0; r == 1 && k < PyTuple_GET_SIZE(sz); k++) {
            int64_t d = 0;
            r = get_i64(PyTuple_GET_ITEM(sz, k), &d);
            if (r == 0 || (r == 1 && d < 0)) r = ASK;
        }
    }
    Py_XDECREF(val);
    Py_XDECREF(dyn);
    Py_XDECREF(st);
    if (r == 1) *sizes = sz;
    else Py_XDECREF(sz);
    return r;
}

/* _Matcher.literal(i, (Int,)) taken as a usable int (not None, not a bool): 1 with *obj
 * (borrowed, an exact int of 64 bits) and *v, 0 when Python's would be None or a bool, ASK, -1. */
static int literal_int(const Plan *p, PyObject *i, PyObject **obj, int64_t *v) {
    PyObject *val = NULL;
    Py_ssize_t k = 0;
    int r = value_index(p, i, &k);
    if (r == 1) r = payload(p, i, &val);
    if (r == 1) r = payload_is(val, p->int_t);
    Py_XDECREF(val);
    if (r == 1) {
        int w = PySet_Contains(p->written, i);
        r = w < 0 ? -1 : w ? 0 : 1;
    }
    if (r != 1) return r;
    PyObject *t = PyList_GET_ITEM(p->template_, k);
    if (t == Py_None || PyBool_Check(t)) return 0;
    r = get_i64(t, v);
    if (r == 1) *obj = t;
    return r == 0 ? ASK : r;
}

/* _Matcher.is_none(i): 1, 0, ASK, -1. */
static int is_none(const Plan *p, PyObject *i) {
    PyObject *val = NULL;
    int r = payload(p, i, &val);
    if (r == 1) r = payload_is(val, p->null_t);
    Py_XDECREF(val);
    if (r == 1) {
        int w = PySet_Contains(p->written, i);
        r = w < 0 ? -1 : w ? 0 : 1;
    }
    return r;
}

/* _Matcher.optional_int(i) as usable: 1 with *obj Py_None (a literal None) or an int (then
 * *v), 0 when Python's is False, ASK, -1. */
static int optional_int(const Plan *p, PyObject *i, PyObject **obj, int64_t *v) {
    int r = is_none(p, i);
    if (r == 1) {
        *obj = Py_None;
        return 1;
    }
    return r == 0 ? literal_int(p, i, obj, v) : r;
}

/* lists[i] when it is (bool, tuple of exact ints): 1 with *items (borrowed) and *optional; 0
 * when i is not a list value; ASK; -1. */
static int list_items(const Plan *p, PyObject *i, PyObject **items, int *optional) {
    PyObject *lst = PyDict_GetItemWithError(p->lists, i);
    if (lst == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyTuple_CheckExact(lst) || PyTuple_GET_SIZE(lst) != 2 || !PyBool_Check(PyTuple_GET_ITEM(lst, 0)) ||
        !PyTuple_CheckExact(PyTuple_GET_ITEM(lst, 1)))
        return ASK;
    *items = PyTuple_GET_ITEM(lst, 1);
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(*items); k++) {
        int64_t v = 0;
        int r = get_i64(PyTuple_GET_ITEM(*items, k), &v);
        if (r != 1) return r < 0 ? -1 : ASK;
    }
    *optional = PyTuple_GET_ITEM(lst, 0) == Py_True;
    return 1;
}

/* _Matcher.int_list(i): 1 with v[0..*n), 0 for None, ASK, -1. */
static int int_list(const Plan *p, PyObject *i, int64_t *v, Py_ssize_t *n) {
    PyObject *items = NULL;
    int optional = 0;
    int r = list_items(p, i, &items, &optional);
    if (r != 1) return r;
    if (optional) return 0;
    r = PySet_Contains(p->written, i);
    if (r) return r < 0 ? -1 : 0;
    if (PyTuple_GET_SIZE(items) > MAX_DIMS) return ASK;
    *n = PyTuple_GET_SIZE(items);
    for (Py_ssize_t k = 0; k < *n; k++) {
        PyObject *j = PyTuple_GET_ITEM(items, k), *obj = NULL;
        if (PyLong_AsLongLong(j) < 0) return 0;
        r = literal_int(p, j, &obj, &v[k]);
        if (r != 1) return r;
    }
    return 1;
}

/* prod(v[0..n)) into *out: 1, ASK when it does not fit in 64 bits (v >= 0 or -1s excluded). */
static int product(const int64_t *v, Py_ssize_t n, int64_t skip, int64_t *out) {
    int64_t x = 1;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (v[k] == skip) continue;
        if (v[k] < 0) return ASK;
        if (v[k] && x > INT64_MAX / v[k]) return ASK;
        x *= v[k];
    }
    *out = x;
    return 1;
}

/* regions[i] as three ints of 64 bits: 1, 0 (not planned), ASK, -1. */
static int region_of(PyObject *regions, PyObject *i, int64_t r3[3]) {
    PyObject *reg = PyDict_GetItemWithError(regions, i);
    if (reg == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyTuple_CheckExact(reg) || PyTuple_GET_SIZE(reg) != 3) return ASK;
    for (int k = 0; k < 3; k++) {
        int r = get_i64(PyTuple_GET_ITEM(reg, k), &r3[k]);
        if (r != 1) return r < 0 ? -1 : ASK;
    }
    return 1;
}

/* A tuple of ints from v[0..n). */
static PyObject *int_tuple(const int64_t *v, Py_ssize_t n) {
    PyObject *t = PyTuple_New(n);
    for (Py_ssize_t k = 0; t && k < n; k++) {
        PyObject *x = PyLong_FromLongLong(v[k]);
        if (x == NULL) Py_CLEAR(t);
        else PyTuple_SET_ITEM(t, k, x);
    }
    return t;
}

/* The sizes tuple as int64s (checked by static_tensor). */
static Py_ssize_t shape_of(PyObject *sizes, int64_t *v) {
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(sizes); k++) v[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(sizes, k));
    return PyTuple_GET_SIZE(sizes);
}

/* _Matcher.kernel_call's results are {out} (out: parameter nparams - 1 of the call, ``ret``
 * what it writes) and no other parameter names out, directly or as a list member: 1, 0, ASK,
 * -1. a_args: a tuple of at least nparams >= 1 items. */
static int single_out(const Plan *p, PyObject *a_args, PyObject *ret, Py_ssize_t nparams) {
    PyObject *out = PyTuple_GET_ITEM(a_args, nparams - 1);
    int64_t out_v = 0, v = 0;
    int r = get_i64(out, &out_v);
    if (r != 1) return r < 0 ? -1 : ASK;
    /* kernel_call's results == {out} */
    if (ret != Py_None && !PyTuple_CheckExact(ret)) return ASK;
    Py_ssize_t nres = 0;
    int other = 0;
    for (Py_ssize_t k = 0; ret != Py_None && k < PyTuple_GET_SIZE(ret); k++) {
        PyObject *x = PyTuple_GET_ITEM(ret, k), *items = NULL;
        int optional = 0;
        r = get_i64(x, &v);
        if (r == 1) r = list_items(p, x, &items, &optional);
        else if (r == 0) r = ASK;
        if (r == ASK || r < 0) return r;
        if (r == 0) {
            nres++;
            other |= v != out_v;
            continue;
        }
        for (Py_ssize_t q = 0; q < PyTuple_GET_SIZE(items); q++) {
            int64_t j = PyLong_AsLongLong(PyTuple_GET_ITEM(items, q));
            if (j < 0) continue;
            nres++;
            other |= j != out_v;
        }
    }
    if (!nres || other) return 0;
    /* out named among the other parameters (list members too) */
    for (Py_ssize_t k = 0; k + 1 < nparams; k++) {
        PyObject *x = PyTuple_GET_ITEM(a_args, k), *items = NULL;
        int optional = 0;
        r = get_i64(x, &v);
        if (r != 1) return r < 0 ? -1 : ASK;
        if (v == out_v) return 0;
        r = list_items(p, x, &items, &optional);
        if (r == ASK || r < 0) return r;
        for (Py_ssize_t q = 0; r == 1 && q < PyTuple_GET_SIZE(items); q++) {
            int64_t j = PyLong_AsLongLong(PyTuple_GET_ITEM(items, q));
            if (j >= 0 && j == out_v) return 0;
        }
    }
    return 1;
}

/* Layout operator kinds (_optimize._LAYOUT_OPS), as the caller numbers them. */
enum { L_PERMUTE = 1, L_TRANSPOSE, L_T, L_VIEW, L_SAME, L_SQUEEZE, L_EXPAND, L_SLICE };

/* _Matcher.layout_link(pc) for kernel call ``a`` whose operator is a layout one of kind
 * ``kind`` with ``nparams`` parameters (its kernel's count): 1 with *res (src, out, ops), 0 for
 * None, ASK, -1. */
static int layout_link(const Plan *p, PyObject *a_args, PyObject *ret, PyObject *regions, long kind,
                       Py_ssize_t nparams, PyObject **res) {
    static const Py_ssize_t needs[] = {0, 3, 4, 2, 3, 1, 3, 4, 6};  /* parameters a kind reads, out included */
    if (!PyTuple_CheckExact(a_args) || kind < L_PERMUTE || kind > L_SLICE || nparams < needs[kind]) return ASK;
    if (PyTuple_GET_SIZE(a_args) < nparams) return 0;
    PyObject *src = PyTuple_GET_ITEM(a_args, 0), *out = PyTuple_GET_ITEM(a_args, nparams - 1);
    int r = single_out(p, a_args, ret, nparams);
    if (r != 1) return r;
    int64_t ro[3], rs[3];
    r = region_of(regions, out, ro);
    if (r != 1) return r;
    PyObject *sdt = NULL, *odt = NULL, *ssz = NULL, *osz = NULL, *ops = NULL;
    int rs_ = static_tensor(p, src, &sdt, &ssz);
    int ro_ = rs_ < 0 ? -1 : static_tensor(p, out, &odt, &osz);
    if (rs_ < 0 || ro_ < 0) r = -1;
    else if (rs_ == ASK || ro_ == ASK) r = ASK;
    else if (rs_ == 0 || ro_ == 0) r = 0;
    else {
        int ne = PyObject_RichCompareBool(sdt, odt, Py_NE);
        r = ne < 0 ? -1 : ne ? 0 : 1;
    }
    if (r == 1) {  /* storage.overlap(src, out) */
        int got = region_of(regions, src, rs);
        if (got < 0 || got == ASK) r = got;
        else if (got == 1 && rs[0] == ro[0] && rs[1] < ro[2] && ro[1] < rs[2]) r = 0;
    }
    int64_t shape[MAX_DIMS], oshape[MAX_DIMS], arg[MAX_DIMS];
    Py_ssize_t ndim = 0, ond = 0, narg = 0;
    if (r == 1) {
        ndim = shape_of(ssz, shape);
        ond = shape_of(osz, oshape);
    }
    /* The operation as ops: 'T' (axes in arg), 'R' (sizes in arg), 'S' or none. */
    char op = 0;
    PyObject *s_start = NULL, *s_end = NULL;
    int64_t s_dim = 0, s_step = 0;
    PyObject *s_step_o = NULL;
    if (r == 1 && kind == L_PERMUTE) {
        r = int_list(p, PyTuple_GET_ITEM(a_args, 1), arg, &narg);
        if (r == 1 && narg != ndim) r = 0;
        unsigned char seen[MAX_DIMS] = {0};
        for (Py_ssize_t k = 0; r == 1 && k < narg; k++) {
            if (!(-ndim <= arg[k] && arg[k] < ndim)) r = 0;
            else {
                arg[k] = floor_mod(arg[k], ndim);
                if (seen[arg[k]]++) r = 0;
            }
        }
        op = 'T';
    } else if (r == 1 && kind == L_TRANSPOSE) {
        PyObject *o0 = NULL, *o1 = NULL;
        int64_t d0 = 0, d1 = 0;
        int r0 = literal_int(p, PyTuple_GET_ITEM(a_args, 1), &o0, &d0);
        int r1 = r0 < 0 ? -1 : literal_int(p, PyTuple_GET_ITEM(a_args, 2), &o1, &d1);
        r = r0 < 0 || r1 < 0 ? -1 : r0 == ASK || r1 == ASK ? ASK : r0 == 0 || r1 == 0 ? 0 : 1;
        if (r == 1 && ndim) {
            if (!(-ndim <= d0 && d0 < ndim && -ndim <= d1 && d1 < ndim)) r = 0;
            for (Py_ssize_t k = 0; k < ndim; k++) arg[k] = k;
            if (r == 1) {
                int64_t a0 = floor_mod(d0, ndim), a1 = floor_mod(d1, ndim);
                arg[a0] = a1;
                arg[a1] = a0;
                narg = ndim;
                op = 'T';
            }
        }
    } else if (r == 1 && kind == L_T) {
        if (ndim > 2) r = 0;
        for (Py_ssize_t k = 0; k < ndim; k++) arg[k] = ndim - 1 - k;
        narg = ndim;
        op = 'T';
    } else if (r == 1 && kind == L_SQUEEZE) {
        Py_ssize_t a = 0, b = 0;
        for (;;) {
            while (a < ndim && shape[a] == 1) a++;
            while (b < ond && oshape[b] == 1) b++;
            if (a == ndim || b == ond) break;
            if (shape[a++] != oshape[b++]) {
                r = 0;
                break;
            }
        }
        if (a != ndim || b != ond) r = 0;
        memcpy(arg, oshape, (size_t)ond * sizeof(int64_t));
        narg = ond;
        op = 'R';
    } else if (r == 1 && kind == L_EXPAND) {
        if (ndim != ond || memcmp(shape, oshape, (size_t)ndim * sizeof(int64_t))) r = 0;
        else r = int_list(p, PyTuple_GET_ITEM(a_args, 1), arg, &narg);
        narg = 0;
    } else if (r == 1 && kind == L_SLICE) {
        PyObject *o = NULL;
        int64_t e = 0, sv = 0;
        int rd = literal_int(p, PyTuple_GET_ITEM(a_args, 1), &o, &s_dim);
        int rp = rd < 0 ? -1 : literal_int(p, PyTuple_GET_ITEM(a_args, 4), &s_step_o, &s_step);
        int ra = rp < 0 ? -1 : optional_int(p, PyTuple_GET_ITEM(a_args, 2), &s_start, &sv);
        int rb = ra < 0 ? -1 : optional_int(p, PyTuple_GET_ITEM(a_args, 3), &s_end, &e);
        r = rd < 0 || rp < 0 || ra < 0 || rb < 0 ? -1
            : rd == ASK || rp == ASK || ra == ASK || rb == ASK ? ASK
            : rd == 0 || rp == 0 || ra == 0 || rb == 0 ? 0 : 1;
        if (r == 1 && (s_step <= 0 || !ndim || !(-ndim <= s_dim && s_dim < ndim))) r = 0;
        op = 'S';
    } else if (r == 1 && kind == L_VIEW) {
        r = int_list(p, PyTuple_GET_ITEM(a_args, 1), arg, &narg);
        int64_t n = 0, known = 0;
        if (r == 1) r = product(shape, ndim, -2, &n);
        Py_ssize_t holes = 0;
        for (Py_ssize_t k = 0; r == 1 && k < narg; k++) {
            holes += arg[k] == -1;
            if (arg[k] < -1) r = 0;
        }
        if (r == 1 && holes > 1) r = 0;
        if (r == 1) r = product(arg, narg, -1, &known);
        if (r == 1 && holes) {
            if (known == 0 || n % known) r = 0;
            for (Py_ssize_t k = 0; r == 1 && k < narg; k++)
                if (arg[k] == -1) arg[k] = n / known;
        }
        op = 'R';
    } else if (r == 1 && kind != L_SAME) {
        r = ASK;
    }
    /* _apply_shape(shape, ops) == out's sizes */
    int64_t now[MAX_DIMS];
    Py_ssize_t nnow = ndim;
    if (r == 1) {
        memcpy(now, shape, (size_t)ndim * sizeof(int64_t));
        if (op == 'T') {
            for (Py_ssize_t k = 0; k < narg; k++) now[k] = shape[arg[k]];
        } else if (op == 'R') {
            int64_t a = 0, b = 0;
            r = product(arg, narg, -2, &a);
            if (r == 1) r = product(shape, ndim, -2, &b);
            if (r == 1 && a != b) r = 0;
            memcpy(now, arg, (size_t)narg * sizeof(int64_t));
            nnow = narg;
        } else if (op == 'S') {
            PyObject *sl = PySlice_New(s_start, s_end, s_step_o);
            Py_ssize_t start = 0, stop = 0, step = 0;
            if (sl == NULL || PySlice_Unpack(sl, &start, &stop, &step) < 0) r = -1;
            else now[floor_mod(s_dim, ndim)] = PySlice_AdjustIndices((Py_ssize_t)shape[floor_mod(s_dim, ndim)], &start, &stop, step);
            Py_XDECREF(sl);
        }
        if (r == 1 && (nnow != ond || memcmp(now, oshape, (size_t)ond * sizeof(int64_t)))) r = 0;
    }
    if (r == 1) {  /* ops */
        PyObject *one = NULL;
        if (op == 'T' || op == 'R') {
            PyObject *t = int_tuple(arg, narg);
            one = t ? Py_BuildValue("(sN)", op == 'T' ? "T" : "R", t) : NULL;
        } else if (op == 'S') {
            one = Py_BuildValue("(s(NOOO))", "S", PyLong_FromLongLong(floor_mod(s_dim, ndim)), s_start, s_end, s_step_o);
        }
        ops = op ? (one ? PyTuple_Pack(1, one) : NULL) : PyTuple_New(0);
        Py_XDECREF(one);
        *res = ops ? PyTuple_Pack(3, src, out, ops) : NULL;
        Py_XDECREF(ops);
        if (*res == NULL) r = -1;
    }
    Py_XDECREF(ssz);
    Py_XDECREF(osz);
    return r;
}

/* Reads a plan for the matchers: 1, 0 when an input is not of the shape _Matcher makes. */
static int plan_init(Plan *p) {
    p->s_val = PyUnicode_InternFromString("val");
    p->s_sizes = PyUnicode_InternFromString("sizes");
    p->s_dyn = PyUnicode_InternFromString("shape_dynamism");
    p->s_st = PyUnicode_InternFromString("scalar_type");
    if (!p->s_val || !p->s_sizes || !p->s_dyn || !p->s_st) return -1;
    return PyDict_CheckExact(p->lists) && PyTuple_CheckExact(p->values) && PyList_CheckExact(p->template_) &&
           PyAnySet_CheckExact(p->written) && PyDict_CheckExact(p->to_numpy) && PyType_Check(p->tensor_t) &&
           PyType_Check(p->int_t) && PyType_Check(p->null_t);
}

static void plan_clear(Plan *p) {
    Py_XDECREF(p->s_val);
    Py_XDECREF(p->s_sizes);
    Py_XDECREF(p->s_dyn);
    Py_XDECREF(p->s_st);
}

/* layout_links(instructions, rets, lists, values, template, written, regions, op_kinds,
 * to_numpy, KernelCall, Tensor, Int, Null, ask) -> _Matcher.layout_link(pc) for every pc (a
 * list), ``ask`` where the Python code is to answer. ``op_kinds[op_index]``: (kind, parameter
 * count) of a layout operator whose kernel has that count, else None. None when an input is not
 * a list / dict / tuple / set as _Matcher makes them. */
static PyObject *layout_links(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *instructions, *rets, *regions, *op_kinds, *kernel_t, *ask;
    Plan p = {0};
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOO", &instructions, &rets, &p.lists, &p.values, &p.template_, &p.written,
                          &regions, &op_kinds, &p.to_numpy, &kernel_t, &p.tensor_t, &p.int_t, &p.null_t, &ask))
        return NULL;
    int state = plan_init(&p);
    if (state == 1 && (!PyList_CheckExact(instructions) || !PyList_CheckExact(rets) ||
                       PyList_GET_SIZE(rets) != PyList_GET_SIZE(instructions) || !PyDict_CheckExact(regions) ||
                       !PyList_CheckExact(op_kinds) || !PyType_Check(kernel_t)))
        state = 0;
    PyObject *s_args = PyUnicode_InternFromString("args"), *s_op = PyUnicode_InternFromString("op_index");
    Py_ssize_t n = state == 1 ? PyList_GET_SIZE(instructions) : 0;
    PyObject *out = state == 1 ? PyList_New(n) : NULL;
    if (s_args == NULL || s_op == NULL || (state == 1 && out == NULL)) state = -1;
    for (Py_ssize_t pc = 0; state == 1 && pc < n; pc++) {
        PyObject *a = PyList_GET_ITEM(instructions, pc), *res = NULL, *opi = NULL, *a_args = NULL;
        int r = payload_is(a, kernel_t);
        if (r == 1) r = (opi = PyObject_GetAttr(a, s_op)) ? 1 : -1;
        int64_t k = 0;
        if (r == 1) r = get_i64(opi, &k);
        if (r == 1 && (k < 0 || k >= PyList_GET_SIZE(op_kinds))) r = ASK;
        else if (r == 0 && opi != NULL) r = ASK;
        PyObject *kind = r == 1 ? PyList_GET_ITEM(op_kinds, k) : NULL;
        if (r == 1 && kind == Py_None) r = 0;
        if (r == 1 && !(PyTuple_CheckExact(kind) && PyTuple_GET_SIZE(kind) == 2)) r = ASK;
        int64_t code = 0, np_ = 0;
        if (r == 1) {  /* (kind, parameters), ints in range */
            r = get_i64(PyTuple_GET_ITEM(kind, 0), &code);
            if (r == 1) r = get_i64(PyTuple_GET_ITEM(kind, 1), &np_);
            if (r == 0 || (r == 1 && (code < L_PERMUTE || code > L_SLICE || np_ < 0 || np_ > MAX_NAMED))) r = ASK;
        }
        if (r == 1) r = (a_args = PyObject_GetAttr(a, s_args)) ? 1 : -1;
        if (r == 1) r = layout_link(&p, a_args, PyList_GET_ITEM(rets, pc), regions, (long)code, (Py_ssize_t)np_, &res);
        Py_XDECREF(opi);
        Py_XDECREF(a_args);
        if (r < 0) {
            state = -1;
            break;
        }
        PyList_SET_ITEM(out, pc, r == 1 ? res : Py_NewRef(r == 0 ? Py_None : ask));
    }
    Py_XDECREF(s_args);
    Py_XDECREF(s_op);
    plan_clear(&p);
    if (state == 1) return out;
    Py_XDECREF(out);
    if (state < 0) return NULL;
    Py_RETURN_NONE;
}

/* ew_ops(instructions, rets, lists, values, template, written, slots, op_params, to_numpy,
 * dtypes, KernelCall, Tensor, Int, Null, ask) -> _Matcher.ew_op(pc) for every pc (a list),
 * ``ask`` where the Python code is to answer: (name, params, out) when the instruction calls an
 * elementwise operator ``op_params[op_index] == (name, parameter count)`` (None: another
 * operator, or its kernel's count differs) writing only out, a planned static tensor (``slots``:
 * CompiledPlan.slots) of a dtype in ``dtypes``. None when an input is not of the type _Matcher
 * makes. */
static PyObject *ew_ops(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *instructions, *rets, *slots, *op_params, *dtypes, *kernel_t, *ask;
    Plan p = {0};
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOO", &instructions, &rets, &p.lists, &p.values, &p.template_, &p.written,
                          &slots, &op_params, &p.to_numpy, &dtypes, &kernel_t, &p.tensor_t, &p.int_t, &p.null_t, &ask))
        return NULL;
    int state = plan_init(&p);
    if (state == 1 && (!PyList_CheckExact(instructions) || !PyList_CheckExact(rets) ||
                       PyList_GET_SIZE(rets) != PyList_GET_SIZE(instructions) || !PyList_CheckExact(slots) ||
                       !PyList_CheckExact(op_params) || !PyTuple_CheckExact(dtypes) || !PyType_Check(kernel_t)))
        state = 0;
    PyObject *s_args = PyUnicode_InternFromString("args"), *s_op = PyUnicode_InternFromString("op_index");
    PyObject *s_dynamic = PyUnicode_InternFromString("dynamic");
    Py_ssize_t n = state == 1 ? PyList_GET_SIZE(instructions) : 0;
    PyObject *out = state == 1 ? PyList_New(n) : NULL;
    if (s_args == NULL || s_op == NULL || s_dynamic == NULL || (state == 1 && out == NULL)) state = -1;
    for (Py_ssize_t pc = 0; state == 1 && pc < n; pc++) {
        PyObject *a = PyList_GET_ITEM(instructions, pc), *res = NULL, *opi = NULL, *a_args = NULL, *dyn = NULL;
        PyObject *dt = NULL, *sizes = NULL;
        int r = payload_is(a, kernel_t);
        if (r == 1) r = (opi = PyObject_GetAttr(a, s_op)) ? 1 : -1;
        int64_t k = 0, np_ = 0;
        if (r == 1) {
            r = get_i64(opi, &k);
            if (r == 0 || (r == 1 && (k < 0 || k >= PyList_GET_SIZE(op_params)))) r = ASK;
        }
        PyObject *entry = r == 1 ? PyList_GET_ITEM(op_params, k) : NULL;
        if (r == 1 && entry == Py_None) r = 0;
        if (r == 1) {  /* (name, parameters) */
            r = PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 2 ? get_i64(PyTuple_GET_ITEM(entry, 1), &np_) : 0;
            if (r == 0 || (r == 1 && (np_ < 1 || np_ > MAX_NAMED))) r = ASK;
        }
        if (r == 1) r = (a_args = PyObject_GetAttr(a, s_args)) ? 1 : -1;
        if (r == 1 && !PyTuple_CheckExact(a_args)) r = ASK;
        if (r == 1 && PyTuple_GET_SIZE(a_args) < np_) r = 0;
        if (r == 1) r = single_out(&p, a_args, PyList_GET_ITEM(rets, pc), (Py_ssize_t)np_);
        PyObject *o = r == 1 ? PyTuple_GET_ITEM(a_args, np_ - 1) : NULL;
        if (r == 1) {  /* storage.static(out): a planned tensor of static shape */
            Py_ssize_t i = 0;
            r = value_index(&p, o, &i);
            if (r == 1 && i >= PyList_GET_SIZE(slots)) r = ASK;
            PyObject *slot = r == 1 ? PyList_GET_ITEM(slots, i) : NULL;
            if (r == 1 && slot == Py_None) r = 0;
            if (r == 1) r = (dyn = PyObject_GetAttr(slot, s_dynamic)) ? 1 : -1;
            if (r == 1) r = dyn == Py_False ? 1 : dyn == Py_True ? 0 : ASK;
        }
        if (r == 1) r = static_tensor(&p, o, &dt, &sizes);
        if (r == 1) {
            int in = PySequence_Contains(dtypes, dt);
            r = in < 0 ? -1 : in ? 1 : 0;
        }
        if (r == 1) {
            PyObject *params = PyTuple_GetSlice(a_args, 0, (Py_ssize_t)np_);
            res = params ? PyTuple_Pack(3, PyTuple_GET_ITEM(entry, 0), params, o) : NULL;
            Py_XDECREF(params);
            if (res == NULL) r = -1;
        }
        Py_XDECREF(opi);
        Py_XDECREF(a_args);
        Py_XDECREF(dyn);
        Py_XDECREF(sizes);
        if (r < 0) {
            state = -1;
            break;
        }
        PyList_SET_ITEM(out, pc, r == 1 ? res : Py_NewRef(r == 0 ? Py_None : ask));
    }
    Py_XDECREF(s_args);
    Py_XDECREF(s_op);
    Py_XDECREF(s_dynamic);
    plan_clear(&p);
    if (state == 1) return out;
    Py_XDECREF(out);
    if (state < 0) return NULL;
    Py_RETURN_NONE;
}

/* ---- convolutions and their batch norms (_Matcher.conv, _read_conv_static, the checks of
 * _Matcher.batch_norm_fold) ------------------------------------------------------------------ */

/* What the convolution table reads beyond a Plan: CompiledPlan.slots, PlanUses.mentions /
 * outputs, the dtypes a fold takes, numpy's ndarray and the Bool / Double payload types. */
typedef struct {
    PyObject *slots, *mentions, *outputs, *dtypes, *ndarray_t, *bool_t, *double_t;
    PyObject *s_dtype, *s_shape, *s_dim_order;
} Extra;

/* Every result of a kernel call (``ret``: None or a tuple of ints, a list value counting as its
 * members >= 0) is one of allowed[0..na): 1, 0, ASK, -1. */
static int results_within(const Plan *p, PyObject *ret, const int64_t *allowed, int na) {
    if (ret == Py_None) return 1;
    if (!PyTuple_CheckExact(ret)) return ASK;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(ret); k++) {
        PyObject *x = PyTuple_GET_ITEM(ret, k), *items = NULL;
        int64_t v = 0;
        int optional = 0, r = get_i64(x, &v);
        if (r != 1) return r < 0 ? -1 : ASK;
        r = list_items(p, x, &items, &optional);
        if (r == ASK || r < 0) return r;
        Py_ssize_t m = r == 1 ? PyTuple_GET_SIZE(items) : 1;
        for (Py_ssize_t q = 0; q < m; q++) {
            int64_t j = r == 1 ? PyLong_AsLongLong(PyTuple_GET_ITEM(items, q)) : v;
            if (r == 1 && j < 0) continue;
            int in = 0;
            for (int a = 0; a < na; a++) in |= j == allowed[a];
            if (!in) return 0;
        }
    }
    return 1;
}

/* How many times value v is named among args[0..upto) with each list value's members (>= 0)
 * after it (_expand(args[:upto], lists).count(v)): 1 with *count, ASK, -1. */
static int count_named(const Plan *p, PyObject *a_args, Py_ssize_t upto, int64_t v, Py_ssize_t *count) {
    *count = 0;
    for (Py_ssize_t k = 0; k < upto; k++) {
        PyObject *x = PyTuple_GET_ITEM(a_args, k), *items = NULL;
        int64_t i = 0;
        int optional = 0, r = get_i64(x, &i);
        if (r != 1) return r < 0 ? -1 : ASK;
        *count += i == v;
        r = list_items(p, x, &items, &optional);
        if (r == ASK || r < 0) return r;
        for (Py_ssize_t q = 0; r == 1 && q < PyTuple_GET_SIZE(items); q++) {
            int64_t j = PyLong_AsLongLong(PyTuple_GET_ITEM(items, q));
            *count += j >= 0 && j == v;
        }
    }
    return 1;
}

/* pc in mentions.get(value, ()): 1, 0, ASK (not a set), -1. */
static int mentioned_at(const Extra *e, PyObject *value, PyObject *pc) {
    PyObject *s = PyDict_GetItemWithError(e->mentions, value);
    if (s == NULL) return PyErr_Occurred() ? -1 : 0;
    return PyAnySet_CheckExact(s) ? PySet_Contains(s, pc) : ASK;
}

/* PlanUses.only_named_by(value, (pc0, pc1)) for distinct instruction numbers (pc1 may be NULL):
 * 1, 0, ASK, -1. */
static int only_named_by(const Extra *e, PyObject *value, PyObject *pc0, PyObject *pc1) {
    int r = PySet_Contains(e->outputs, value);
    if (r) return r < 0 ? -1 : 0;
    PyObject *s = PyDict_GetItemWithError(e->mentions, value);
    if (s == NULL) return PyErr_Occurred() ? -1 : 1;
    if (!PyAnySet_CheckExact(s)) return ASK;
    Py_ssize_t in = 0;
    PyObject *pcs[2] = {pc0, pc1};
    for (int k = 0; k < 2 && pcs[k]; k++) {
        r = PySet_Contains(s, pcs[k]);
        if (r < 0) return -1;
        in += r;
    }
    return PySet_GET_SIZE(s) == in;
}

/* _Matcher.planned(i) (slots[i] is not None): 1, 0, ASK, -1. */
static int planned(const Plan *p, const Extra *e, PyObject *i) {
    Py_ssize_t k = 0;
    int r = value_index(p, i, &k);
    if (r != 1) return r;
    if (k >= PyList_GET_SIZE(e->slots)) return ASK;
    return PyList_GET_ITEM(e->slots, k) != Py_None;
}

/* values[i].val when it is a Tensor (a new reference in *val): 1, 0 (another payload), ASK, -1. */
static int tensor_of(const Plan *p, PyObject *i, PyObject **val) {
    int r = payload(p, i, val);
    if (r == 1) r = payload_is(*val, p->tensor_t);
    if (r != 1) Py_CLEAR(*val);
    return r;
}

/* _Matcher.tensor_meta(a) == tensor_meta(b) (scalar type, sizes, dim order, shape dynamism;
 * None for a value not a tensor): 1, 0, ASK, -1. */
static int same_meta(const Plan *p, const Extra *e, PyObject *a, PyObject *b) {
    PyObject *va = NULL, *vb = NULL;
    int ra = tensor_of(p, a, &va), rb = ra < 0 ? -1 : tensor_of(p, b, &vb);
    int r = ra < 0 || rb < 0 ? -1 : ra == ASK || rb == ASK ? ASK : ra == 0 || rb == 0 ? ra == rb : 1;
    if (r == 1 && va != NULL) {
        PyObject *names[4] = {p->s_st, p->s_sizes, e->s_dim_order, p->s_dyn};
        for (int k = 0; r == 1 && k < 4; k++) {
            PyObject *x = PyObject_GetAttr(va, names[k]), *y = x ? PyObject_GetAttr(vb, names[k]) : NULL;
            if (y == NULL) r = -1;
            else if ((k == 1 || k == 2) && !(PyTuple_CheckExact(x) && PyTuple_CheckExact(y))) r = ASK;  /* tuple() of them */
            else r = PyObject_RichCompareBool(x, y, Py_EQ);
            Py_XDECREF(x);
            Py_XDECREF(y);
        }
    }
    Py_XDECREF(va);
    Py_XDECREF(vb);
    return r;
}

/* _Matcher.dtype(i): 1 with *dt (borrowed from to_numpy; NULL for None), ASK, -1. */
static int tensor_dtype(const Plan *p, PyObject *i, PyObject **dt) {
    PyObject *val = NULL, *st = NULL;
    *dt = NULL;
    int r = tensor_of(p, i, &val);
    if (r == 0) return 1;
    if (r == 1) r = (st = PyObject_GetAttr(val, p->s_st)) ? 1 : -1;
    if (r == 1 && PyLong_Check(st)) {
        *dt = PyDict_GetItemWithError(p->to_numpy, st);
        if (*dt == NULL && PyErr_Occurred()) r = -1;
    }
    Py_XDECREF(val);
    Py_XDECREF(st);
    return r;
}

/* tuple(values[i].val.sizes) of a tensor (a new reference, the tuple itself): 1, 0 (not a
 * tensor), ASK (sizes not a tuple), -1. */
static int tensor_sizes(const Plan *p, PyObject *i, PyObject **sizes) {
    PyObject *val = NULL;
    int r = tensor_of(p, i, &val);
    if (r == 1) r = (*sizes = PyObject_GetAttr(val, p->s_sizes)) ? 1 : -1;
    if (r == 1 && !PyTuple_CheckExact(*sizes)) {
        Py_CLEAR(*sizes);
        r = ASK;
    }
    Py_XDECREF(val);
    return r;
}

/* Whether values[i].val's payload is exactly one of t0, t1 (t1 may be NULL), not written:
 * 1 with *k its index, 0, ASK (a subclass, an index out of range), -1. */
static int literal_of(const Plan *p, PyObject *i, PyObject *t0, PyObject *t1, Py_ssize_t *k) {
    PyObject *val = NULL;
    int r = value_index(p, i, k);
    if (r == 1) r = payload(p, i, &val);
    if (r == 1) {
        r = payload_is(val, t0);
        if (r == 0 && t1 != NULL) r = payload_is(val, t1);
    }
    Py_XDECREF(val);
    if (r == 1) {
        int w = PySet_Contains(p->written, i);
        r = w < 0 ? -1 : w ? 0 : 1;
    }
    return r;
}

/* _Matcher.literal(i, (Bool,)) is False: 1, 0, ASK, -1. */
static int literal_false(const Plan *p, const Extra *e, PyObject *i) {
    Py_ssize_t k = 0;
    int r = literal_of(p, i, e->bool_t, NULL, &k);
    return r == 1 ? PyList_GET_ITEM(p->template_, k) == Py_False : r;
}

/* _Matcher.literal(i, (Double, Int)) as a number (not None, not a bool): 1 with *obj
 * (borrowed), 0, ASK, -1. */
static int literal_number(const Plan *p, const Extra *e, PyObject *i, PyObject **obj) {
    Py_ssize_t k = 0;
    int r = literal_of(p, i, e->double_t, p->int_t, &k);
    if (r != 1) return r;
    *obj = PyList_GET_ITEM(p->template_, k);
    return *obj != Py_None && !PyBool_Check(*obj);
}

/* _Matcher.constant(i): 1 with *arr (borrowed from the template), 0 for None, ASK, -1. */
static int constant(const Plan *p, const Extra *e, PyObject *i, PyObject **arr) {
    Py_ssize_t k = 0;
    int r = value_index(p, i, &k);
    if (r != 1) return r;
    PyObject *t = PyList_GET_ITEM(p->template_, k);
    r = PyObject_IsInstance(t, e->ndarray_t);
    if (r <= 0) return r;
    if (k >= PyList_GET_SIZE(e->slots)) return ASK;
    if (PyList_GET_ITEM(e->slots, k) != Py_None) return 0;
    r = PySet_Contains(p->written, i);
    if (r) return r < 0 ? -1 : 0;
    *arr = t;
    return 1;
}

/* arr.dtype and arr.shape (new references; shape an exact tuple): 1, ASK, -1. */
static int array_meta(const Extra *e, PyObject *arr, PyObject **dt, PyObject **shape) {
    *dt = PyObject_GetAttr(arr, e->s_dtype);
    *shape = *dt ? PyObject_GetAttr(arr, e->s_shape) : NULL;
    if (*shape == NULL) {
        Py_CLEAR(*dt);
        return -1;
    }
    if (PyTuple_CheckExact(*shape)) return 1;
    Py_CLEAR(*dt);
    Py_CLEAR(*shape);
    return ASK;
}

/* batch_norm_fold's vec(i, optional): 1 with *c (a constant of dtype dt and shape (oc,),
 * borrowed; Py_None for a literal None where optional), 0 (Python's False), ASK, -1. */
static int fold_vec(const Plan *p, const Extra *e, PyObject *i, int optional, PyObject *dt, PyObject *oc,
                    PyObject **c) {
    int r = optional ? is_none(p, i) : 0;
    if (r == 1) {
        *c = Py_None;
        return 1;
    }
    if (r == 0) r = constant(p, e, i, c);
    if (r != 1) return r;
    PyObject *cdt = NULL, *shape = NULL;
    r = array_meta(e, *c, &cdt, &shape);
    if (r == 1) r = PyObject_RichCompareBool(cdt, dt, Py_EQ);
    if (r == 1) r = PyTuple_GET_SIZE(shape) == 1 ? PyObject_RichCompareBool(PyTuple_GET_ITEM(shape, 0), oc, Py_EQ) : 0;
    Py_XDECREF(cdt);
    Py_XDECREF(shape);
    return r;
}

/* _read_conv_static(params) (params: a convolution's ten arguments, a tuple): 1 with *res
 * ((s0, s1), (p0, p1), (d0, d1), groups), 0 for None, ASK, -1. */
static int conv_static(const Plan *p, const Extra *e, PyObject *params, PyObject **res) {
    PyObject *dt = NULL, *sizes = NULL, *g = NULL;
    int r = static_tensor(p, PyTuple_GET_ITEM(params, 1), &dt, &sizes);
    if (r == 1) r = PyTuple_GET_SIZE(sizes) == 4;
    Py_XDECREF(sizes);
    if (r == 1) r = literal_false(p, e, PyTuple_GET_ITEM(params, 6));
    int64_t v[3][MAX_DIMS], gv = 0;
    for (int k = 0; r == 1 && k < 3; k++) {
        Py_ssize_t n = 0;
        r = int_list(p, PyTuple_GET_ITEM(params, 3 + k), v[k], &n);
        if (r == 1) r = n == 2;
    }
    if (r == 1) r = literal_int(p, PyTuple_GET_ITEM(params, 8), &g, &gv);
    if (r == 1) {
        PyObject *a = int_tuple(v[0], 2), *b = int_tuple(v[1], 2), *c = int_tuple(v[2], 2);
        *res = a && b && c ? PyTuple_Pack(4, a, b, c, g) : NULL;
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_XDECREF(c);
        if (*res == NULL) r = -1;
    }
    return r;
}

/* The arguments (a new reference, a tuple of at least ``nparams``) of kernel call ``a`` when
 * its operator's code in ``codes`` is ``want``: 1, 0, ASK, -1. */
static int kernel_args(PyObject *a, PyObject *kernel_t, PyObject *codes, long want, Py_ssize_t nparams,
                       PyObject *s_op, PyObject *s_args, PyObject **a_args) {
    PyObject *opi = NULL;
    int64_t k = 0, code = 0;
    int r = payload_is(a, kernel_t);
    if (r == 1) r = (opi = PyObject_GetAttr(a, s_op)) ? 1 : -1;
    if (r == 1) {
        r = get_i64(opi, &k);
        if (r == 0 || (r == 1 && (k < 0 || k >= PyList_GET_SIZE(codes)))) r = ASK;
    }
    Py_XDECREF(opi);
    if (r == 1 && PyList_GET_ITEM(codes, k) == Py_None) r = 0;
    if (r == 1) {
        r = get_i64(PyList_GET_ITEM(codes, k), &code);
        if (r == 0) r = ASK;
    }
    if (r == 1 && code != want) r = 0;
    if (r == 1) r = (*a_args = PyObject_GetAttr(a, s_args)) ? 1 : -1;
    if (r == 1 && !PyTuple_CheckExact(*a_args)) r = ASK;
    if (r == 1 && PyTuple_GET_SIZE(*a_args) < nparams) r = 0;
    if (r != 1 && r != -1) Py_CLEAR(*a_args);
    return r;
}

enum { C_CONV = 1, C_BN = 2 };

/* _Matcher.conv for kernel call arguments a_args (a tuple of at least 10) writing ``ret``: 1
 * with *res (params, out), 0 for None, ASK, -1. */
static int conv_of(const Plan *p, const Extra *e, PyObject *a_args, PyObject *ret, PyObject **res) {
    PyObject *out = PyTuple_GET_ITEM(a_args, 9), *val = NULL;
    int64_t o = 0;
    Py_ssize_t c = 0;
    int r = get_i64(out, &o);
    if (r == 0) r = ASK;
    if (r == 1) r = results_within(p, ret, &o, 1);
    if (r == 1) r = count_named(p, a_args, 9, o, &c);
    if (r == 1) r = c == 0;
    if (r == 1) r = planned(p, e, out);
    if (r == 1) r = tensor_of(p, out, &val);
    Py_XDECREF(val);
    if (r == 1) {
        PyObject *params = PyTuple_GetSlice(a_args, 0, 10);
        *res = params ? PyTuple_Pack(2, params, out) : NULL;
        Py_XDECREF(params);
        if (*res == NULL) r = -1;
    }
    return r;
}

/* The checks of _Matcher.batch_norm_fold(pc, conv_params, y) for batch norm arguments b_args (a
 * tuple of at least 10) writing ``ret``; pc_o, prev_o: pc and pc - 1 as ints. 1 with *res (o0,
 * w, b, gamma, beta, mean, var, eps, the convolution input's sizes) as the Python checks give
 * them, 0 for None, ASK, -1. */
static int bn_checks(const Plan *p, const Extra *e, PyObject *b_args, PyObject *ret, PyObject *conv_params,
                     PyObject *y, PyObject *pc_o, PyObject *prev_o, PyObject **res) {
    PyObject *o[3] = {PyTuple_GET_ITEM(b_args, 7), PyTuple_GET_ITEM(b_args, 8), PyTuple_GET_ITEM(b_args, 9)};
    int64_t x = 0, yv = 0, ov[3] = {0, 0, 0};
    Py_ssize_t c = 0;
    int r = get_i64(PyTuple_GET_ITEM(b_args, 0), &x);
    if (r == 1) r = get_i64(y, &yv);
    for (int k = 0; r == 1 && k < 3; k++) r = get_i64(o[k], &ov[k]);
    if (r == 0) r = ASK;
    if (r == 1) r = x == yv;
    if (r == 1) r = count_named(p, b_args, PyTuple_GET_SIZE(b_args), yv, &c);
    if (r == 1) r = c == 1;
    if (r == 1) r = only_named_by(e, y, prev_o, pc_o);
    if (r == 1) r = ov[0] != ov[1] && ov[0] != ov[2] && ov[1] != ov[2];
    if (r == 1) r = results_within(p, ret, ov, 3);
    if (r == 1) r = yv != ov[0] && yv != ov[1] && yv != ov[2];
    for (int k = 0; r == 1 && k < 3; k++) {
        r = count_named(p, b_args, 7, ov[k], &c);
        if (r == 1) r = c == 0;
    }
    if (r == 1) {
        r = mentioned_at(e, o[0], prev_o);
        if (r == 0 || r == 1) r = !r;
    }
    if (r == 1) r = only_named_by(e, o[1], pc_o, NULL);
    if (r == 1) r = only_named_by(e, o[2], pc_o, NULL);
    if (r == 1) r = planned(p, e, o[0]);
    if (r == 1) r = same_meta(p, e, o[0], y);
    /* the convolution's constants */
    PyObject *w = NULL, *dt = NULL, *shape = NULL, *oc = NULL, *xdt = NULL, *sizes = NULL, *xsizes = NULL;
    if (r == 1) r = constant(p, e, PyTuple_GET_ITEM(conv_params, 1), &w);
    if (r == 1) r = array_meta(e, w, &dt, &shape);
    if (r == 1) r = PySequence_Contains(e->dtypes, dt);
    if (r == 1) r = PyTuple_GET_SIZE(shape) >= 3;
    if (r == 1) r = PyObject_IsTrue(oc = PyTuple_GET_ITEM(shape, 0));
    if (r == 1) r = tensor_dtype(p, PyTuple_GET_ITEM(conv_params, 0), &xdt);
    if (r == 1) r = xdt != NULL ? PyObject_RichCompareBool(xdt, dt, Py_EQ) : 0;
    if (r == 1) r = tensor_dtype(p, y, &xdt);
    if (r == 1) r = xdt != NULL ? PyObject_RichCompareBool(xdt, dt, Py_EQ) : 0;
    if (r == 1) r = tensor_sizes(p, y, &sizes);
    if (r == 1) r = PyTuple_GET_SIZE(sizes) == PyTuple_GET_SIZE(shape);
    if (r == 1) r = PyObject_RichCompareBool(PyTuple_GET_ITEM(sizes, 1), oc, Py_EQ);
    if (r == 1) r = literal_false(p, e, PyTuple_GET_ITEM(conv_params, 6));
    PyObject *v[5] = {NULL, NULL, NULL, NULL, NULL}, *eps = NULL;
    PyObject *vi[5] = {PyTuple_GET_ITEM(conv_params, 2), PyTuple_GET_ITEM(b_args, 1), PyTuple_GET_ITEM(b_args, 2),
                       PyTuple_GET_ITEM(b_args, 3), PyTuple_GET_ITEM(b_args, 4)};
    /* every vector is asked (Python's vec calls all five before it looks at one) */
    int got = r, some_false = 0;
    for (int k = 0; got == 1 && k < 5; k++) {
        int q = fold_vec(p, e, vi[k], k < 3, dt, oc, &v[k]);
        if (q < 0 || q == ASK) got = q;
        some_false |= q == 0;
    }
    r = got == 1 && some_false ? 0 : got;
    if (r == 1) r = literal_number(p, e, PyTuple_GET_ITEM(b_args, 6), &eps);
    if (r == 1) r = tensor_sizes(p, PyTuple_GET_ITEM(conv_params, 0), &xsizes);
    if (r == 1) {
        *res = PyTuple_Pack(9, o[0], w, v[0], v[1], v[2], v[3], v[4], eps, xsizes);
        if (*res == NULL) r = -1;
    }
    Py_XDECREF(dt);
    Py_XDECREF(shape);
    Py_XDECREF(sizes);
    Py_XDECREF(xsizes);
    return r;
}

/* conv_folds(instructions, rets, lists, values, template, written, slots, mentions, outputs,
 * op_codes, dtypes, to_numpy, ndarray, KernelCall, Tensor, Int, Null, Bool, Double, ask) ->
 * (convs, statics, folds), three lists with an entry per instruction pc (``ask`` where the
 * Python code is to answer): convs[pc] is _Matcher.conv(pc); where that is (params, out),
 * statics[pc] is _read_conv_static(params) and folds[pc] the checks of
 * batch_norm_fold(pc + 1, params, out) (see bn_checks); None elsewhere (ask where convs[pc] is).
 * ``op_codes[op_index]``: 1 for aten::convolution.out, 2 for the inference batch norm (each
 * where its kernel has 10 parameters), else None. None when an input is not of the type
 * _Matcher makes. */
static PyObject *conv_folds(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *instructions, *rets, *codes, *kernel_t, *ask;
    Plan p = {0};
    Extra e = {0};
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOOOOOOO", &instructions, &rets, &p.lists, &p.values, &p.template_,
                          &p.written, &e.slots, &e.mentions, &e.outputs, &codes, &e.dtypes, &p.to_numpy, &e.ndarray_t,
                          &kernel_t, &p.tensor_t, &p.int_t, &p.null_t, &e.bool_t, &e.double_t, &ask))
        return NULL;
    int state = plan_init(&p);
    if (state == 1 && (!PyList_CheckExact(instructions) || !PyList_CheckExact(rets) ||
                       PyList_GET_SIZE(rets) != PyList_GET_SIZE(instructions) || !PyList_CheckExact(e.slots) ||
                       !PyDict_CheckExact(e.mentions) || !PyAnySet_CheckExact(e.outputs) || !PyList_CheckExact(codes) ||
                       !PyTuple_CheckExact(e.dtypes) || !PyType_Check(e.ndarray_t) || !PyType_Check(kernel_t) ||
                       !PyType_Check(e.bool_t) || !PyType_Check(e.double_t)))
        state = 0;
    PyObject *s_args = PyUnicode_InternFromString("args"), *s_op = PyUnicode_InternFromString("op_index");
    e.s_dtype = PyUnicode_InternFromString("dtype");
    e.s_shape = PyUnicode_InternFromString("shape");
    e.s_dim_order = PyUnicode_InternFromString("dim_order");
    Py_ssize_t n = state == 1 ? PyList_GET_SIZE(instructions) : 0;
    PyObject *tables[3] = {NULL, NULL, NULL};
    for (int k = 0; state == 1 && k < 3; k++)
        if ((tables[k] = PyList_New(n)) == NULL) state = -1;
    if (!s_args || !s_op || !e.s_dtype || !e.s_shape || !e.s_dim_order) state = -1;
    for (Py_ssize_t pc = 0; state == 1 && pc < n; pc++) {
        PyObject *a_args = NULL, *b_args = NULL, *cv = NULL, *stat = NULL, *fold = NULL, *pc_o = NULL, *nx_o = NULL;
        int r = kernel_args(PyList_GET_ITEM(instructions, pc), kernel_t, codes, C_CONV, 10, s_op, s_args, &a_args);
        if (r == 1) r = conv_of(&p, &e, a_args, PyList_GET_ITEM(rets, pc), &cv);
        int rs = r, rf = r;
        if (r == 1) rs = conv_static(&p, &e, PyTuple_GET_ITEM(cv, 0), &stat);
        if (r == 1 && rs >= 0) {
            rf = pc + 1 < n ? kernel_args(PyList_GET_ITEM(instructions, pc + 1), kernel_t, codes, C_BN, 10, s_op, s_args,
                                          &b_args) : 0;
            if (rf == 1) rf = (pc_o = PyLong_FromSsize_t(pc)) && (nx_o = PyLong_FromSsize_t(pc + 1)) ? 1 : -1;
            if (rf == 1)
                rf = bn_checks(&p, &e, b_args, PyList_GET_ITEM(rets, pc + 1), PyTuple_GET_ITEM(cv, 0),
                               PyTuple_GET_ITEM(cv, 1), nx_o, pc_o, &fold);
        }
        Py_XDECREF(a_args);
        Py_XDECREF(b_args);
        Py_XDECREF(pc_o);
        Py_XDECREF(nx_o);
        if (r < 0 || rs < 0 || rf < 0) {
            Py_XDECREF(cv);
            Py_XDECREF(stat);
            Py_XDECREF(fold);
            state = -1;
            break;
        }
        PyObject *got[3] = {cv, stat, fold};
        int how[3] = {r, rs, rf};
        for (int k = 0; k < 3; k++)
            PyList_SET_ITEM(tables[k], pc, how[k] == 1 ? got[k] : Py_NewRef(how[k] == 0 ? Py_None : ask));
    }
    Py_XDECREF(s_args);
    Py_XDECREF(s_op);
    Py_XDECREF(e.s_dtype);
    Py_XDECREF(e.s_shape);
    Py_XDECREF(e.s_dim_order);
    plan_clear(&p);
    PyObject *found = state == 1 ? PyTuple_Pack(3, tables[0], tables[1], tables[2]) : NULL;
    for (int k = 0; k < 3; k++) Py_XDECREF(tables[k]);
    if (found != NULL || state < 0) return found;
    Py_RETURN_NONE;
}

/* ---- constant copies (the checks of _optimize._constant_copy) ------------------------------ */

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The instructions other than pc that name out, sorted (sorted(mentions.get(out, ()) - {pc})),
 * each a reader _constant_copy accepts: one at or after pc, a kernel call naming out among its
 * parameters as often as with list members counted (nparams[op_index]: its kernel's count, None
 * without one), or a delegate call naming it only directly. 1 with *res (a tuple of ints), 0,
 * ASK, -1. */
static int copy_readers(const Plan *p, const Extra *e, PyObject *instructions, PyObject *nparams,
                        PyObject *kernel_t, PyObject *delegate_t, PyObject *s_op, PyObject *s_args, PyObject *out,
                        Py_ssize_t pc, PyObject **res) {
    int64_t o = 0;
    int r = get_i64(out, &o);
    if (r != 1) return r < 0 ? -1 : ASK;
    PyObject *s = PyDict_GetItemWithError(e->mentions, out);
    if (s == NULL && PyErr_Occurred()) return -1;
    if (s != NULL && !PyAnySet_CheckExact(s)) return ASK;
    Py_ssize_t n = s == NULL ? 0 : PySet_GET_SIZE(s), m = 0;
    int64_t *rs = PyMem_Malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    PyObject *it = s == NULL ? NULL : PyObject_GetIter(s), *x = NULL;
    if (rs == NULL || (s != NULL && it == NULL)) r = -1;
    while (r == 1 && it != NULL && (x = PyIter_Next(it)) != NULL) {
        int64_t v = 0;
        r = get_i64(x, &v);
        if (r == 0) r = ASK;
        if (r == 1 && v != pc && m < n) rs[m++] = v;
        Py_DECREF(x);
    }
    if (r == 1 && PyErr_Occurred()) r = -1;
    Py_XDECREF(it);
    if (r == 1) qsort(rs, (size_t)m, sizeof(int64_t), cmp_i64);
    Py_ssize_t ni = PyList_GET_SIZE(instructions);
    for (Py_ssize_t k = 0; r == 1 && k < m; k++) {
        if (rs[k] < 0 || rs[k] >= ni) {
            r = ASK;
            break;
        }
        if (rs[k] < pc) {
            r = 0;
            break;
        }
        PyObject *a = PyList_GET_ITEM(instructions, rs[k]), *a_args = NULL, *opi = NULL;
        int isd = payload_is(a, delegate_t), isk = isd == 0 ? payload_is(a, kernel_t) : 0;
        Py_ssize_t all = 0, direct = 0, upto = 0;
        int64_t op = 0;
        if (isd < 0 || isk < 0) r = -1;
        else if (isd == ASK || isk == ASK) r = ASK;
        else if (!isd && !isk) r = 0;
        if (r == 1) r = (a_args = PyObject_GetAttr(a, s_args)) ? 1 : -1;
        if (r == 1 && !PyTuple_CheckExact(a_args)) r = ASK;
        if (r == 1) upto = PyTuple_GET_SIZE(a_args);
        if (r == 1 && isk) {
            r = (opi = PyObject_GetAttr(a, s_op)) ? get_i64(opi, &op) : -1;
            if (r == 0 || (r == 1 && (op < 0 || op >= PyList_GET_SIZE(nparams)))) r = ASK;
            PyObject *np_ = r == 1 ? PyList_GET_ITEM(nparams, op) : NULL;
            int64_t c = 0;
            if (r == 1 && np_ == Py_None) r = 0;
            if (r == 1) r = get_i64(np_, &c);
            if (r == 0 && np_ != Py_None) r = ASK;
            if (r == 1 && c < 0) r = ASK;
            if (r == 1 && c < upto) upto = (Py_ssize_t)c;
        }
        Py_XDECREF(opi);
        if (r == 1) r = count_named(p, a_args, PyTuple_GET_SIZE(a_args), o, &all);
        for (Py_ssize_t q = 0; r == 1 && q < upto; q++) {
            int64_t v = 0;
            r = get_i64(PyTuple_GET_ITEM(a_args, q), &v);  /* (count_named checked them) */
            direct += v == o;
        }
        if (r == 1) r = all == direct;
        Py_XDECREF(a_args);
    }
    if (r == 1) *res = int_tuple(rs, m);
    if (r == 1 && *res == NULL) r = -1;
    PyMem_Free(rs);
    return r;
}

/* _constant_copy's checks of kernel call ``a`` (see const_copies): 1 with *res, 0, ASK, -1. */
static int copy_checks(const Plan *p, const Extra *e, PyObject *instructions, Py_ssize_t pc, PyObject *ret,
                       PyObject *copy_ops, PyObject *nparams, PyObject *kernel_t, PyObject *delegate_t,
                       PyObject *writers, PyObject *inputs, PyObject *s_op, PyObject *s_args, PyObject *s_dynamic,
                       PyObject **res) {
    PyObject *a = PyList_GET_ITEM(instructions, pc), *opi = NULL, *a_args = NULL, *entry = NULL;
    int64_t k = 0;
    int r = payload_is(a, kernel_t);
    if (r == 1) r = (opi = PyObject_GetAttr(a, s_op)) ? get_i64(opi, &k) : -1;
    if (r == 0 && opi != NULL) r = ASK;
    if (r == 1 && (k < 0 || k >= PyList_GET_SIZE(copy_ops))) r = ASK;
    Py_XDECREF(opi);
    if (r == 1) {
        entry = PyList_GET_ITEM(copy_ops, k);  /* (name, is aten::_to_copy.out) */
        if (entry == Py_None) r = 0;
        else if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2 || !PyBool_Check(PyTuple_GET_ITEM(entry, 1)))
            r = ASK;
    }
    if (r == 1) r = (a_args = PyObject_GetAttr(a, s_args)) ? 1 : -1;
    if (r == 1 && !PyTuple_CheckExact(a_args)) r = ASK;
    if (r == 1 && PyTuple_GET_SIZE(a_args) < 4) r = 0;
    PyObject *src = r == 1 ? PyTuple_GET_ITEM(a_args, 0) : NULL, *nb = r == 1 ? PyTuple_GET_ITEM(a_args, 1) : NULL;
    PyObject *fmt = r == 1 ? PyTuple_GET_ITEM(a_args, 2) : NULL, *out = r == 1 ? PyTuple_GET_ITEM(a_args, 3) : NULL;
    PyObject *cst = NULL, *dt = NULL, *sizes = NULL, *nbv = NULL, *order = NULL, *readers = NULL, *dyn = NULL;
    int64_t o = 0, sz[MAX_DIMS], ord[MAX_DIMS], count = 0;
    Py_ssize_t nb_k = 0, nord = 0;
    if (r == 1) r = constant(p, e, src, &cst);
    if (r == 1) r = static_tensor(p, out, &dt, &sizes);
    if (r == 1) {
        r = get_i64(out, &o);
        if (r == 0) r = ASK;
    }
    if (r == 1) {  /* kernel_call's results == {out} */
        r = results_within(p, ret, &o, 1);
        if (r == 1) r = ret != Py_None && PyTuple_GET_SIZE(ret) > 0;  /* (a list value of no members: Python's ask) */
        if (r == 1 && PyTuple_GET_SIZE(ret) > 1) r = ASK;
        if (r == 1 && PyDict_Contains(p->lists, PyTuple_GET_ITEM(ret, 0))) r = ASK;
    }
    if (r == 1) r = literal_of(p, nb, e->bool_t, NULL, &nb_k);
    if (r == 1) r = (nbv = PyList_GET_ITEM(p->template_, nb_k)) != Py_None;
    if (r == 1) {  /* no memory format / dim order, or the identity dim order */
        r = is_none(p, fmt);
        if (r == 1) order = Py_None;
        else if (r == 0 && PyTuple_GET_ITEM(entry, 1) == Py_True) r = 0;
        else if (r == 0) {
            r = int_list(p, fmt, ord, &nord);
            if (r == 0) {
                order = Py_None;
                r = 1;
            } else if (r == 1) {
                r = nord == PyTuple_GET_SIZE(sizes);
                for (Py_ssize_t q = 0; r == 1 && q < nord; q++) r = ord[q] == q;
            }
        }
    }
    if (r == 1) {  /* storage.static(out) */
        Py_ssize_t i = 0;
        r = value_index(p, out, &i);
        if (r == 1 && i >= PyList_GET_SIZE(e->slots)) r = ASK;
        PyObject *slot = r == 1 ? PyList_GET_ITEM(e->slots, i) : NULL;
        if (r == 1 && slot == Py_None) r = 0;
        if (r == 1) r = (dyn = PyObject_GetAttr(slot, s_dynamic)) ? 1 : -1;
        if (r == 1) r = dyn == Py_False ? 1 : dyn == Py_True ? 0 : ASK;
    }
    if (r == 1) r = PySet_Contains(e->outputs, out) ? (PyErr_Occurred() ? -1 : 0) : 1;
    if (r == 1) r = PySet_Contains(inputs, out) ? (PyErr_Occurred() ? -1 : 0) : 1;
    if (r == 1) {  /* writers.get(out) == frozenset({pc}) */
        PyObject *w = PyDict_GetItemWithError(writers, out);
        if (w == NULL) r = PyErr_Occurred() ? -1 : 0;
        else if (!PyAnySet_CheckExact(w)) r = ASK;
        else if (PySet_GET_SIZE(w) != 1) r = 0;
        else {
            PyObject *pc_o = PyLong_FromSsize_t(pc);
            r = pc_o ? PySet_Contains(w, pc_o) : -1;
            Py_XDECREF(pc_o);
        }
    }
    if (r == 1) r = product(sz, shape_of(sizes, sz), -2, &count);
    if (r == 1) r = count <= 4096;
    if (r == 1) r = copy_readers(p, e, instructions, nparams, kernel_t, delegate_t, s_op, s_args, out, pc, &readers);
    if (r == 1 && order != Py_None) r = (order = int_tuple(ord, nord)) ? 1 : -1;
    if (r == 1) {
        PyObject *lst = order == Py_None ? Py_NewRef(Py_None) : PySequence_List(order);
        *res = lst ? PyTuple_Pack(8, PyTuple_GET_ITEM(entry, 0), cst, nbv, lst, out, dt, sizes, readers) : NULL;
        Py_XDECREF(lst);
        if (*res == NULL) r = -1;
    }
    if (order != Py_None) Py_XDECREF(order);
    Py_XDECREF(readers);
    Py_XDECREF(sizes);
    Py_XDECREF(dyn);
    Py_XDECREF(a_args);
    return r;
}

/* const_copies(instructions, rets, lists, values, template, written, slots, mentions, writers,
 * outputs, inputs, copy_ops, nparams, to_numpy, ndarray, KernelCall, DelegateCall, Tensor, Int,
 * Null, Bool, ask) -> the checks of _optimize._constant_copy for every instruction (a list;
 * ``ask`` where the Python code is to answer): (name, the constant, non_blocking's literal, the
 * dim order (None or a list), out, its dtype, its sizes, the readers) where they pass, else
 * None. ``copy_ops[op_index]``: (name, whether it is aten::_to_copy.out) for the two constant
 * copy operators whose kernels have 4 parameters, else None; ``nparams[op_index]``: the
 * operator's kernel's parameter count, None without a kernel. None when an input is not of the
 * type _Matcher makes. */
static PyObject *const_copies(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *instructions, *rets, *writers, *inputs, *copy_ops, *nparams, *kernel_t, *delegate_t, *ask;
    Plan p = {0};
    Extra e = {0};
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOOOOOOOOOOO", &instructions, &rets, &p.lists, &p.values, &p.template_,
                          &p.written, &e.slots, &e.mentions, &writers, &e.outputs, &inputs, &copy_ops, &nparams,
                          &p.to_numpy, &e.ndarray_t, &kernel_t, &delegate_t, &p.tensor_t, &p.int_t, &p.null_t,
                          &e.bool_t, &ask))
        return NULL;
    int state = plan_init(&p);
    if (state == 1 && (!PyList_CheckExact(instructions) || !PyList_CheckExact(rets) ||
                       PyList_GET_SIZE(rets) != PyList_GET_SIZE(instructions) || !PyList_CheckExact(e.slots) ||
                       !PyDict_CheckExact(e.mentions) || !PyDict_CheckExact(writers) ||
                       !PyAnySet_CheckExact(e.outputs) || !PyAnySet_CheckExact(inputs) ||
                       !PyList_CheckExact(copy_ops) || !PyList_CheckExact(nparams) || !PyType_Check(e.ndarray_t) ||
                       !PyType_Check(kernel_t) || !PyType_Check(delegate_t) || !PyType_Check(e.bool_t)))
        state = 0;
    PyObject *s_args = PyUnicode_InternFromString("args"), *s_op = PyUnicode_InternFromString("op_index");
    PyObject *s_dynamic = PyUnicode_InternFromString("dynamic");
    Py_ssize_t n = state == 1 ? PyList_GET_SIZE(instructions) : 0;
    PyObject *out = state == 1 ? PyList_New(n) : NULL;
    if (!s_args || !s_op || !s_dynamic || (state == 1 && out == NULL)) state = -1;
    for (Py_ssize_t pc = 0; state == 1 && pc < n; pc++) {
        PyObject *res = NULL;
        int r = copy_checks(&p, &e, instructions, pc, PyList_GET_ITEM(rets, pc), copy_ops, nparams, kernel_t,
                            delegate_t, writers, inputs, s_op, s_args, s_dynamic, &res);
        if (r < 0) {
            state = -1;
            break;
        }
        PyList_SET_ITEM(out, pc, r == 1 ? res : Py_NewRef(r == 0 ? Py_None : ask));
    }
    Py_XDECREF(s_args);
    Py_XDECREF(s_op);
    Py_XDECREF(s_dynamic);
    plan_clear(&p);
    if (state == 1) return out;
    Py_XDECREF(out);
    if (state < 0) return NULL;
    Py_RETURN_NONE;
}

/* same_bytes(regions, slots) -> _Storage.same_bytes(): value -> its group (one list shared by
 * the group) of the plain values (slot of static shape, no dim order or the identity one) with
 * one region of a positive size and one dtype, for groups of two or more. The comparisons are
 * Python's (any objects); None when regions is not a dict or slots not a list, or a value is not
 * an int in range of slots. */
static PyObject *same_bytes(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *regions, *slots;
    if (!PyArg_ParseTuple(args, "OO", &regions, &slots)) return NULL;
    if (!PyDict_CheckExact(regions) || !PyList_CheckExact(slots)) Py_RETURN_NONE;
    PyObject *groups = PyDict_New(), *found = NULL;
    PyObject *s_dynamic = PyUnicode_InternFromString("dynamic"), *s_order = PyUnicode_InternFromString("dim_order");
    PyObject *s_bound = PyUnicode_InternFromString("bound"), *s_dtype = PyUnicode_InternFromString("dtype");
    int state = groups && s_dynamic && s_order && s_bound && s_dtype ? 1 : -1;
    Py_ssize_t pos = 0;
    PyObject *j, *r;
    while (state == 1 && PyDict_Next(regions, &pos, &j, &r)) {
        Py_INCREF(j);
        Py_INCREF(r);
        PyObject *dyn = NULL, *order = NULL, *bound = NULL, *ident = NULL, *dtype = NULL, *key = NULL;
        int64_t k = 0;
        int plain = 0;
        if (!PyTuple_CheckExact(r) || PyTuple_GET_SIZE(r) != 3) state = 0;
        if (state == 1) {
            plain = PyObject_RichCompareBool(PyTuple_GET_ITEM(r, 2), PyTuple_GET_ITEM(r, 1), Py_GT);
            if (plain < 0) state = -1;
        }
        if (state == 1 && plain) {  /* _Storage._plain(j) */
            state = get_i64(j, &k);
            if (state == 1 && (k < 0 || k >= PyList_GET_SIZE(slots))) state = 0;
            PyObject *slot = state == 1 ? PyList_GET_ITEM(slots, k) : NULL;
            plain = slot != NULL && slot != Py_None;
            if (plain && (dyn = PyObject_GetAttr(slot, s_dynamic)) == NULL) state = -1;
            if (plain && state == 1) {
                int t = PyObject_IsTrue(dyn);
                if (t < 0) state = -1;
                plain = t == 0;
            }
            if (plain && state == 1 && (order = PyObject_GetAttr(slot, s_order)) == NULL) state = -1;
            if (plain && state == 1) {
                int t = PyObject_IsTrue(order);
                if (t < 0) state = -1;
                else if (t) {  /* dim_order == tuple(range(len(bound))) */
                    Py_ssize_t nb = (bound = PyObject_GetAttr(slot, s_bound)) ? PyObject_Length(bound) : -1;
                    ident = nb >= 0 ? PyTuple_New(nb) : NULL;
                    for (Py_ssize_t q = 0; ident && q < nb; q++) {
                        PyObject *x = PyLong_FromSsize_t(q);
                        if (x == NULL) Py_CLEAR(ident);
                        else PyTuple_SET_ITEM(ident, q, x);
                    }
                    int eq = ident ? PyObject_RichCompareBool(order, ident, Py_EQ) : -1;
                    if (eq < 0) state = -1;
                    plain = eq == 1;
                }
            }
            if (plain && state == 1) {
                PyObject *list = NULL;
                state = (dtype = PyObject_GetAttr(slot, s_dtype)) && (key = PyTuple_Pack(2, r, dtype)) ? 1 : -1;
                if (state == 1 && (list = PyDict_GetItemWithError(groups, key)) == NULL) {
                    state = !PyErr_Occurred() && (list = PyList_New(0)) && PyDict_SetItem(groups, key, list) == 0 ? 1 : -1;
                    Py_XDECREF(list);  /* (groups holds it) */
                }
                if (state == 1 && PyList_Append(list, j) < 0) state = -1;
            }
        }
        Py_XDECREF(dyn); Py_XDECREF(order); Py_XDECREF(bound); Py_XDECREF(ident); Py_XDECREF(dtype); Py_XDECREF(key);
        Py_DECREF(r);
        Py_DECREF(j);
    }
    if (state == 1 && (found = PyDict_New()) == NULL) state = -1;
    pos = 0;
    PyObject *g;
    while (state == 1 && PyDict_Next(groups, &pos, &j, &g)) {
        if (PyList_GET_SIZE(g) < 2) continue;
        for (Py_ssize_t q = 0; state == 1 && q < PyList_GET_SIZE(g); q++)
            if (PyDict_SetItem(found, PyList_GET_ITEM(g, q), g) < 0) state = -1;
    }
    Py_XDECREF(groups);
    Py_XDECREF(s_dynamic); Py_XDECREF(s_order); Py_XDECREF(s_bound); Py_XDECREF(s_dtype);
    if (state == 1) return found;
    Py_XDECREF(found);
    if (state < 0) return NULL;
    Py_RETURN_NONE;
}

/* ---- s40-h: elementwise chains (_Matcher.ew_chain) ---------------------------------------- */

/* What ew_chain reads: a Plan and Extra (slots, mentions, outputs, ndarray, Double), the plan's
 * instructions and operator names, the ew_ops table, the operator name sets and the ask marker. */
typedef struct {
    Plan p;
    Extra e;
    PyObject *instructions, *table, *op_names, *unary, *ordered, *skippable, *kernel_t, *ask;
    Py_ssize_t max_skips;
    PyObject *s_args, *s_op, *s_dynamic;
} Ew;

/* _Storage.static(i): a planned tensor of static shape: 1, 0, ASK, -1. */
static int ew_static(const Ew *w, PyObject *i) {
    Py_ssize_t k = 0;
    int r = value_index(&w->p, i, &k);
    if (r != 1) return r;
    if (k >= PyList_GET_SIZE(w->e.slots)) return ASK;
    PyObject *slot = PyList_GET_ITEM(w->e.slots, k);
    if (slot == Py_None) return 0;
    PyObject *dyn = PyObject_GetAttr(slot, w->s_dynamic);
    if (dyn == NULL) return -1;
    r = dyn == Py_False ? 1 : dyn == Py_True ? 0 : ASK;
    Py_DECREF(dyn);
    return r;
}

/* _Matcher.static_tensor(i) == (dt, shape): 1, 0, ASK, -1. */
static int ew_same(const Ew *w, PyObject *i, PyObject *dt, PyObject *shape) {
    PyObject *d = NULL, *sz = NULL;
    int r = static_tensor(&w->p, i, &d, &sz);
    if (r != 1) return r;
    r = PyObject_RichCompareBool(d, dt, Py_EQ);
    if (r == 1) r = PyObject_RichCompareBool(sz, shape, Py_EQ);
    Py_DECREF(sz);
    return r;
}

/* _Matcher.ew_operand(i, dt, shape): 1, 0, ASK, -1. */
static int ew_operand(const Ew *w, PyObject *i, PyObject *dt, PyObject *shape) {
    PyObject *d = NULL, *sz = NULL, *arr = NULL;
    int r = static_tensor(&w->p, i, &d, &sz);
    if (r != 1) return r;
    r = PyObject_RichCompareBool(d, dt, Py_EQ);
    Py_ssize_t m = PyTuple_GET_SIZE(sz), s = PyTuple_GET_SIZE(shape);
    if (r == 1 && m > s) r = 0;
    for (Py_ssize_t k = 1; r == 1 && k <= m; k++) {  /* broadcasts to shape: each dim 1 or shape's */
        int64_t a = 0, b = 0;
        r = get_i64(PyTuple_GET_ITEM(shape, s - k), &b);
        if (r == 0) r = ASK;
        if (r == 1) {
            a = PyLong_AsLongLong(PyTuple_GET_ITEM(sz, m - k));  /* checked by static_tensor */
            r = a == b || a == 1;
        }
    }
    Py_DECREF(sz);
    if (r != 1) return r;
    r = constant(&w->p, &w->e, i, &arr);
    return r == 0 ? ew_static(w, i) : r;
}

/* _Matcher.ew_bound(i): 1 with *obj (borrowed: None or the literal), 0 for False, ASK, -1. */
static int ew_bound(const Ew *w, PyObject *i, PyObject **obj) {
    int r = is_none(&w->p, i);
    if (r == 1) {
        *obj = Py_None;
        return 1;
    }
    if (r != 0) return r;
    r = literal_number(&w->p, &w->e, i, obj);
    if (r != 1) return r;
    if (PyFloat_CheckExact(*obj)) {
        double v = PyFloat_AS_DOUBLE(*obj);
        return v == v;  /* not NaN */
    }
    return PyLong_CheckExact(*obj) ? 1 : ASK;
}

/* _Matcher.ew_spec(op, cur, cur_pc, x, dt, shape): 1 with *spec (a new reference), 0 for None,
 * ASK, -1. op: an ew_ops entry (checked by the caller: (str, tuple of >= 1 items, out)). */
static int ew_spec(const Ew *w, PyObject *op, PyObject *cur, Py_ssize_t cur_pc, PyObject *x, PyObject *dt,
                   PyObject *shape, PyObject **spec) {
    PyObject *name = PyTuple_GET_ITEM(op, 0), *params = PyTuple_GET_ITEM(op, 1), *lo = NULL, *hi = NULL;
    Py_ssize_t np_ = PyTuple_GET_SIZE(params), count = 0;
    int64_t cur_v = 0, x_v = 0, a = 0, b = 0;
    int r = ew_same(w, PyTuple_GET_ITEM(op, 2), dt, shape);
    if (r != 1) return r;
    if (get_i64(cur, &cur_v) != 1 || get_i64(x, &x_v) != 1) return PyErr_Occurred() ? -1 : ASK;
    if (cur_pc >= 0) {
        r = count_named(&w->p, params, np_ - 1, cur_v, &count);
        if (r != 1) return r;
        if (count != 1) return 0;
    }
    r = PySet_Contains(w->unary, name);
    if (r < 0) return -1;
    if (r) {
        if (get_i64(PyTuple_GET_ITEM(params, 0), &a) != 1) return PyErr_Occurred() ? -1 : ASK;
        if (a != cur_v) return 0;
        lo = hi = Py_None;
        if (np_ == 4) {
            r = ew_bound(w, PyTuple_GET_ITEM(params, 1), &lo);
            if (r == 1) r = ew_bound(w, PyTuple_GET_ITEM(params, 2), &hi);
            if (r != 1) return r;
            if (lo == Py_None && hi == Py_None) return 0;
        }
        *spec = Py_BuildValue("(sOOO)", "u", name, lo, hi);
        return *spec ? 1 : -1;
    }
    if (np_ < 3) return ASK;
    if (np_ == 4) {  /* alpha: a literal 1 */
        PyObject *alpha = NULL;
        r = literal_number(&w->p, &w->e, PyTuple_GET_ITEM(params, 2), &alpha);
        if (r != 1) return r;
        if (PyLong_CheckExact(alpha)) {
            int64_t v = 0;
            r = get_i64(alpha, &v);
            if (r != 1) return r < 0 ? -1 : 0;  /* too large to be 1 */
            if (v != 1) return 0;
        } else if (PyFloat_CheckExact(alpha)) {
            if (PyFloat_AS_DOUBLE(alpha) != 1.0) return 0;
        } else {
            return ASK;
        }
    }
    if (get_i64(PyTuple_GET_ITEM(params, 0), &a) != 1 || get_i64(PyTuple_GET_ITEM(params, 1), &b) != 1)
        return PyErr_Occurred() ? -1 : ASK;
    int right;
    if (cur_pc < 0) {  /* the first operation: the running value is x */
        right = b == x_v && a != x_v;
    } else {
        right = b == cur_v;
        if ((a == cur_v) == right) return 0;
    }
    PyObject *other = PyTuple_GET_ITEM(params, right ? 0 : 1);
    int64_t other_v = right ? a : b;
    if (right && cur_pc < 0) {
        r = PySet_Contains(w->ordered, name);
        if (r) return r < 0 ? -1 : 0;
    }
    if (other_v != x_v) {
        r = ew_operand(w, other, dt, shape);
        if (r != 1) return r;
    }
    if (other_v == x_v && cur_pc < 0) return 0;  /* x op x */
    *spec = Py_BuildValue("(sOOO)", "b", name, other, right ? Py_True : Py_False);
    return *spec ? 1 : -1;
}

/* _Matcher.ew_skippable(pc, {x, cur}): 1, 0, ASK, -1. */
static int ew_skippable(const Ew *w, Py_ssize_t pc, PyObject *x, PyObject *cur) {
    PyObject *a = PyList_GET_ITEM(w->instructions, pc), *opi = NULL, *a_args = NULL;
    int r = payload_is(a, w->kernel_t);
    if (r != 1) return r;
    if ((opi = PyObject_GetAttr(a, w->s_op)) == NULL) return -1;
    int64_t k = 0, x_v = 0, cur_v = 0;
    r = get_i64(opi, &k);
    Py_DECREF(opi);
    if (r != 1 || k < 0 || k >= PyTuple_GET_SIZE(w->op_names)) return r < 0 ? -1 : ASK;
    r = PySet_Contains(w->skippable, PyTuple_GET_ITEM(w->op_names, k));
    if (r != 1) return r;
    if (get_i64(x, &x_v) != 1 || get_i64(cur, &cur_v) != 1) return PyErr_Occurred() ? -1 : ASK;
    if ((a_args = PyObject_GetAttr(a, w->s_args)) == NULL) return -1;
    Py_ssize_t cx = 0, cc = 0;
    r = PyTuple_CheckExact(a_args) ? count_named(&w->p, a_args, PyTuple_GET_SIZE(a_args), x_v, &cx) : ASK;
    if (r == 1) r = count_named(&w->p, a_args, PyTuple_GET_SIZE(a_args), cur_v, &cc);
    Py_DECREF(a_args);
    return r == 1 ? cx == 0 && cc == 0 : r;
}

/* An ew_ops entry for ew_chain: 1 (an operation: (str, tuple of >= 1 items, out)), 0 (None),
 * ASK (ask, or another shape). */
static int ew_entry(const Ew *w, PyObject *op) {
    if (op == Py_None) return 0;
    if (op == w->ask || !PyTuple_CheckExact(op) || PyTuple_GET_SIZE(op) != 3 ||
        !PyUnicode_CheckExact(PyTuple_GET_ITEM(op, 0)) || !PyTuple_CheckExact(PyTuple_GET_ITEM(op, 1)) ||
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(op, 1)) < 1)
        return ASK;
    return 1;
}

/* The walk of _Matcher.ew_chain from instruction pc: 1 with *res (x, ops, dt), 0 for None,
 * ASK, -1. */
static int ew_walk(const Ew *w, Py_ssize_t pc, PyObject *taken, PyObject **res) {
    Py_ssize_t n = PyList_GET_SIZE(w->instructions);
    PyObject *first = PyList_GET_ITEM(w->table, pc), *sizes = NULL, *dt = NULL, *x = NULL, *ops = NULL;
    PyObject *pc_o = PyLong_FromSsize_t(pc);
    if (pc_o == NULL) return -1;
    int r = ew_entry(w, first);
    if (r == 1) {
        r = PySet_Contains(taken, pc_o);
        r = r < 0 ? -1 : !r;
    }
    Py_DECREF(pc_o);
    if (r != 1) return r;
    PyObject *name = PyTuple_GET_ITEM(first, 0), *params = PyTuple_GET_ITEM(first, 1);
    r = static_tensor(&w->p, PyTuple_GET_ITEM(first, 2), &dt, &sizes);
    if (r != 1) return r < 0 ? -1 : ASK;
    /* The running value enters as the first tensor operand of out's dtype and shape. */
    r = PySet_Contains(w->unary, name);
    if (r == 1) {
        x = PyTuple_GET_ITEM(params, 0);
    } else if (r == 0) {
        r = PyTuple_GET_SIZE(params) < 2 ? ASK : 1;
        for (int k = 0; r == 1 && k < 2 && x == NULL; k++) {
            int s = ew_same(w, PyTuple_GET_ITEM(params, k), dt, sizes);
            if (s == 1) x = PyTuple_GET_ITEM(params, k);
            else if (s != 0) r = s;
        }
        if (r == 1 && x == NULL) r = 0;
        if (r == 1 && x == PyTuple_GET_ITEM(params, 1)) {
            int o = PySet_Contains(w->ordered, name);
            r = o < 0 ? -1 : o ? 0 : 1;
        }
    }
    if (r == 1) r = ew_same(w, x, dt, sizes);
    if (r == 1) {
        PyObject *arr = NULL;
        r = constant(&w->p, &w->e, x, &arr);
        if (r == 0) r = ew_static(w, x);
    }
    if (r == 1) r = (ops = PyList_New(0)) ? 1 : -1;
    PyObject *cur = x;
    Py_ssize_t cur_pc = -1, skips = 0;
    for (Py_ssize_t p = pc; r == 1 && p < n;) {
        PyObject *p_o = PyLong_FromSsize_t(p), *op = NULL, *spec = NULL, *item = NULL;
        if (p_o == NULL) {
            r = -1;
            break;
        }
        int s = PySet_Contains(taken, p_o);
        if (s == 0) {
            op = PyList_GET_ITEM(w->table, p);
            s = ew_entry(w, op);
        } else if (s == 1) {
            s = 0;
        }
        if (s == 1) s = ew_spec(w, op, cur, cur_pc, x, dt, sizes, &spec);
        if (s == 0) {  /* no spec: step over a skippable instruction, or end */
            if (PyList_GET_SIZE(ops) && skips < w->max_skips) s = ew_skippable(w, p, x, cur);
            Py_DECREF(p_o);
            if (s == 1) {
                skips++;
                p++;
                continue;
            }
            if (s != 0) r = s;
            break;
        }
        if (s == 1 && cur_pc >= 0) {
            PyObject *cp_o = PyLong_FromSsize_t(cur_pc);
            s = cp_o ? only_named_by(&w->e, cur, cp_o, p_o) : -1;
            Py_XDECREF(cp_o);
            if (s == 0) {
                Py_DECREF(p_o);
                Py_DECREF(spec);
                break;
            }
        }
        if (s == 1) {
            item = PyTuple_Pack(4, p_o, PyTuple_GET_ITEM(op, 0), spec, PyTuple_GET_ITEM(op, 2));
            s = item && PyList_Append(ops, item) == 0 ? 1 : -1;
        }
        Py_DECREF(p_o);
        Py_XDECREF(spec);
        Py_XDECREF(item);
        if (s != 1) {
            r = s;
            break;
        }
        cur = PyTuple_GET_ITEM(op, 2);
        cur_pc = p;
        skips = 0;
        p++;
    }
    if (r == 1 && PyList_GET_SIZE(ops) < 2) r = 0;
    if (r == 1) {
        PyObject *t = PyList_AsTuple(ops);
        *res = t ? PyTuple_Pack(3, x, t, dt) : NULL;
        Py_XDECREF(t);
        if (*res == NULL) r = -1;
    }
    Py_XDECREF(ops);
    Py_DECREF(sizes);
    return r;
}

/* ew_chain(context, pc, taken) -> _Matcher.ew_chain(pc, taken) as (x, ops, dtype), None, or
 * ``ask`` where the Python code is to answer (an input not of the shape _Matcher makes among
 * them). context: (instructions, lists, values, template, written, slots, mentions, outputs,
 * ew_ops table, operator names, unary names, sub/div names, skippable names, max skips,
 * to_numpy, ndarray, KernelCall, Tensor, Int, Null, Double, ask). */
static PyObject *ew_chain(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *ctx, *pc_o, *taken, *max_skips;
    Ew w = {0};
    if (!PyArg_ParseTuple(args, "O!OO", &PyTuple_Type, &ctx, &pc_o, &taken)) return NULL;
    if (!PyArg_ParseTuple(ctx, "OOOOOOOOOOOOOOOOOOOOOO", &w.instructions, &w.p.lists, &w.p.values, &w.p.template_,
                          &w.p.written, &w.e.slots, &w.e.mentions, &w.e.outputs, &w.table, &w.op_names, &w.unary,
                          &w.ordered, &w.skippable, &max_skips, &w.p.to_numpy, &w.e.ndarray_t, &w.kernel_t,
                          &w.p.tensor_t, &w.p.int_t, &w.p.null_t, &w.e.double_t, &w.ask))
        return NULL;
    int state = plan_init(&w.p);
    int64_t pc = 0, ms = 0;
    if (state == 1 && (!PyList_CheckExact(w.instructions) || !PyList_CheckExact(w.table) ||
                       PyList_GET_SIZE(w.table) != PyList_GET_SIZE(w.instructions) || !PyList_CheckExact(w.e.slots) ||
                       !PyDict_CheckExact(w.e.mentions) || !PyAnySet_CheckExact(w.e.outputs) ||
                       !PyTuple_CheckExact(w.op_names) || !PyAnySet_CheckExact(w.unary) ||
                       !PyAnySet_CheckExact(w.ordered) || !PyAnySet_CheckExact(w.skippable) ||
                       !PyAnySet_CheckExact(taken) || !PyType_Check(w.e.ndarray_t) || !PyType_Check(w.kernel_t) ||
                       !PyType_Check(w.e.double_t) || get_i64(pc_o, &pc) != 1 || get_i64(max_skips, &ms) != 1 ||
                       pc < 0 || pc >= PyList_GET_SIZE(w.instructions) || ms < 0))
        state = PyErr_Occurred() ? -1 : ASK;
    w.max_skips = (Py_ssize_t)(ms < PY_SSIZE_T_MAX ? ms : PY_SSIZE_T_MAX);
    w.s_args = PyUnicode_InternFromString("args");
    w.s_op = PyUnicode_InternFromString("op_index");
    w.s_dynamic = PyUnicode_InternFromString("dynamic");
    if (!w.s_args || !w.s_op || !w.s_dynamic) state = -1;
    PyObject *res = NULL;
    if (state == 1) state = ew_walk(&w, (Py_ssize_t)pc, taken, &res);
    Py_XDECREF(w.s_args);
    Py_XDECREF(w.s_op);
    Py_XDECREF(w.s_dynamic);
    plan_clear(&w.p);
    if (state == 1) return res;
    if (state < 0) return NULL;
    return Py_NewRef(state == 0 ? Py_None : w.ask);
}

/* ---- end s40-h ---------------------------------------------------------------------------- */

/* ---- s40-j: _ew_static_ok's memory checks ------------------------------------------------- */

/* What ew_static_ok reads of a plan and its storage. */
typedef struct {
    PyObject *template_, *slots, *written, *regions, *writes_at, *ndarray_t, *skip, *s_dynamic;
    const int64_t *pcs;  /* the chain's instructions */
    Py_ssize_t npcs;
} Sj;

/* The most operations of a chain handled here (a chain is a handful; more: ASK). */
#define SJ_MAX_OPS 256

/* v as an index into template and slots (both in range): 1, ASK, -1. */
static int sj_index(const Sj *s, PyObject *v, Py_ssize_t *k) {
    int64_t x = 0;
    int r = get_i64(v, &x);
    if (r != 1) return r < 0 ? -1 : ASK;
    if (x < 0 || x >= PyList_GET_SIZE(s->template_) || x >= PyList_GET_SIZE(s->slots)) return ASK;
    *k = (Py_ssize_t)x;
    return 1;
}

/* _Matcher.constant(v) is not None: 1, 0, ASK, -1. */
static int sj_constant(const Sj *s, PyObject *v, Py_ssize_t k) {
    int r = PyObject_IsInstance(PyList_GET_ITEM(s->template_, k), s->ndarray_t);
    if (r <= 0) return r;
    if (PyList_GET_ITEM(s->slots, k) != Py_None) return 0;
    r = PySet_Contains(s->written, v);
    return r < 0 ? -1 : !r;
}

/* _Storage.static(v): 1, 0, ASK, -1. */
static int sj_static(const Sj *s, Py_ssize_t k) {
    PyObject *slot = PyList_GET_ITEM(s->slots, k);
    if (slot == Py_None) return 0;
    PyObject *dyn = PyObject_GetAttr(slot, s->s_dynamic);
    if (dyn == NULL) return -1;
    int r = dyn == Py_False ? 1 : dyn == Py_True ? 0 : ASK;
    Py_DECREF(dyn);
    return r;
}

/* _Storage.overlap of two regions as region_of answered them (rv, rw: 1 planned, 0 not). */
static int sj_overlap(int rv, const int64_t a[3], int rw, const int64_t b[3]) {
    return rv == 1 && rw == 1 && a[0] == b[0] && a[1] < b[2] && b[1] < a[2];
}

/* _Storage.written_between(v, start, stop, pcs | skip): 1, 0, ASK, -1. ``rv``/``a``: v's region. */
static int sj_written_between(const Sj *s, int64_t v, int rv, const int64_t a[3], int64_t start, int64_t stop) {
    for (int64_t pc = start + 1; pc < stop; pc++) {
        int mine = 0;
        for (Py_ssize_t j = 0; j < s->npcs && !mine; j++) mine = s->pcs[j] == pc;
        if (mine) continue;
        if (pc < 0 || pc >= PyList_GET_SIZE(s->writes_at)) return ASK;
        PyObject *pc_o = PyLong_FromLongLong((long long)pc);
        if (pc_o == NULL) return -1;
        int r = PySet_Contains(s->skip, pc_o);
        Py_DECREF(pc_o);
        if (r < 0) return -1;
        if (r) continue;
        PyObject *ws = PyList_GET_ITEM(s->writes_at, (Py_ssize_t)pc);
        if (!PyList_CheckExact(ws)) return ASK;
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(ws); j++) {
            PyObject *w = PyList_GET_ITEM(ws, j);
            int64_t wv = 0, b[3] = {0, 0, 0};
            r = get_i64(w, &wv);
            if (r != 1) return r < 0 ? -1 : ASK;
            if (wv == v) return 1;
            int rw = region_of(s->regions, w, b);
            if (rw < 0 || rw == ASK) return rw;
            if (sj_overlap(rv, a, rw, b)) return 1;
        }
    }
    return 0;
}

/* One read of the chain, value v at instruction p: 1 it passes, 0 the chain fails, ASK, -1. */
static int sj_read(const Sj *s, PyObject *v, PyObject *p_o, int64_t first, int64_t last, PyObject *out) {
    Py_ssize_t k = 0;
    int64_t p = 0, vi = 0, a[3] = {0, 0, 0}, b[3] = {0, 0, 0};
    int r = sj_index(s, v, &k);
    if (r == 1) r = sj_constant(s, v, k);
    if (r != 0) return r == 1 ? 1 : r;  /* a constant: no memory checks */
    r = sj_static(s, k);
    if (r != 1) return r;
    if (get_i64(p_o, &p) != 1 || get_i64(v, &vi) != 1) return PyErr_Occurred() ? -1 : ASK;
    int rv = region_of(s->regions, v, a);
    if (rv < 0 || rv == ASK) return rv;
    if (p != first) {
        int64_t oi = 0;
        r = get_i64(out, &oi);
        if (r != 1) return r < 0 ? -1 : ASK;
        if (oi == vi) return 0;
        int ro = region_of(s->regions, out, b);
        if (ro < 0 || ro == ASK) return ro;
        if (sj_overlap(rv, a, ro, b)) return 0;
    }
    r = sj_written_between(s, vi, rv, a, p, last);
    return r == 1 ? 0 : r == 0 ? 1 : r;
}

/* ew_static_ok(context, x, ops, skip) -> _ew_static_ok(mt, _EwChain(x, ops, _), skip): True,
 * False, or ``ask`` where the Python code is to answer (an input not of the shape _Matcher and
 * _Storage make). context: (template, slots, written, regions, writes_at, ndarray, ask). */
static PyObject *ew_static_ok(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *ctx, *x, *ops, *skip, *ask;
    Sj s = {0};
    if (!PyArg_ParseTuple(args, "O!OOO", &PyTuple_Type, &ctx, &x, &ops, &skip)) return NULL;
    if (!PyArg_ParseTuple(ctx, "OOOOOOO", &s.template_, &s.slots, &s.written, &s.regions, &s.writes_at,
                          &s.ndarray_t, &ask))
        return NULL;
    s.skip = skip;
    int64_t pcs[SJ_MAX_OPS];
    s.pcs = pcs;
    int r = PyList_CheckExact(s.template_) && PyList_CheckExact(s.slots) && PyAnySet_CheckExact(s.written) &&
                    PyDict_CheckExact(s.regions) && PyList_CheckExact(s.writes_at) && PyType_Check(s.ndarray_t) &&
                    PyAnySet_CheckExact(skip) && PyTuple_CheckExact(ops) && PyTuple_GET_SIZE(ops) > 0 &&
                    PyTuple_GET_SIZE(ops) <= SJ_MAX_OPS
                ? 1
                : ASK;
    /* Each operation (pc, name, spec, out): its pc an int, its spec a tuple led by a str. */
    for (Py_ssize_t j = 0; r == 1 && j < PyTuple_GET_SIZE(ops); j++) {
        PyObject *op = PyTuple_GET_ITEM(ops, j);
        if (!PyTuple_CheckExact(op) || PyTuple_GET_SIZE(op) != 4 || !PyTuple_CheckExact(PyTuple_GET_ITEM(op, 2)) ||
            PyTuple_GET_SIZE(PyTuple_GET_ITEM(op, 2)) < 3 ||
            !PyUnicode_CheckExact(PyTuple_GET_ITEM(PyTuple_GET_ITEM(op, 2), 0))) {
            r = ASK;
            break;
        }
        int g = get_i64(PyTuple_GET_ITEM(op, 0), &pcs[j]);
        if (g != 1) r = g < 0 ? -1 : ASK;
        s.npcs = j + 1;
    }
    s.s_dynamic = r == 1 ? PyUnicode_InternFromString("dynamic") : NULL;
    if (r == 1 && s.s_dynamic == NULL) r = -1;
    if (r == 1) {
        Py_ssize_t nops = PyTuple_GET_SIZE(ops);
        PyObject *op0 = PyTuple_GET_ITEM(ops, 0), *op_last = PyTuple_GET_ITEM(ops, nops - 1);
        int64_t first = pcs[0], last = pcs[nops - 1];
        PyObject *out = PyTuple_GET_ITEM(op_last, 3);
        /* ew.reads(): the input at the first operation, then each binary operation's other operand. */
        r = sj_read(&s, x, PyTuple_GET_ITEM(op0, 0), first, last, out);
        for (Py_ssize_t j = 0; r == 1 && j < nops; j++) {
            PyObject *op = PyTuple_GET_ITEM(ops, j), *spec = PyTuple_GET_ITEM(op, 2);
            int b = PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(spec, 0), "b");
            if (b == -1 && PyErr_Occurred()) r = -1;
            else if (b == 0) r = sj_read(&s, PyTuple_GET_ITEM(spec, 2), PyTuple_GET_ITEM(op, 0), first, last, out);
        }
    }
    Py_XDECREF(s.s_dynamic);
    if (r < 0) return NULL;
    if (r == ASK) return Py_NewRef(ask);
    return PyBool_FromLong(r);
}

/* ---- end s40-j ---------------------------------------------------------------------------- */

/* ==== _Matcher's layout chains (orchestra/runtime/_optimize.py: producer, layout_chain,
 * chain_sources) ==== */

/* One define of a same-bytes group: position w of value x, x the k-th of its group. */
typedef struct {
    int64_t w, k, x;
} GroupDef;

static int group_def_cmp(const void *a, const void *b) {
    const GroupDef *p = a, *q = b;
    if (p->w != q->w) return p->w < q->w ? -1 : 1;
    return (p->k > q->k) - (p->k < q->k);
}

/* Each int of ``s`` (an exact set / frozenset) passed to f: 1, ASK (not a set, an item not an
 * int of 64 bits), -1. */
static int each_define(PyObject *s, int (*f)(void *, int64_t), void *ctx) {
    if (!PyAnySet_CheckExact(s)) return ASK;
    PyObject *it = PyObject_GetIter(s), *o;
    if (it == NULL) return -1;
    int r = 1;
    while (r == 1 && (o = PyIter_Next(it)) != NULL) {
        int64_t w = 0;
        r = get_i64(o, &w);
        if (r == 0) r = ASK;
        if (r == 1 && f(ctx, w) < 0) r = -1;
        Py_DECREF(o);
    }
    Py_DECREF(it);
    return r == 1 && PyErr_Occurred() ? -1 : r;
}

typedef struct {
    GroupDef *p;
    Py_ssize_t n, cap;
    int64_t k, x;
} GroupDefs;

static int group_defs_push(void *ctx, int64_t w) {
    GroupDefs *b = ctx;
    GroupDef *q = grow_for_one(b->p, b->n, &b->cap, sizeof(GroupDef));
    if (q == NULL) return -1;
    b->p = q;
    b->p[b->n++] = (GroupDef){w, b->k, b->x};
    return 0;
}

/* The defines of group ``g`` (an exact list of exact ints) as bytes of (w, x) int64 pairs sorted
 * by (w, place in g): 1 with *res, ASK, -1. */
static int group_defs(PyObject *g, PyObject *defines, PyObject **res) {
    if (!PyList_CheckExact(g)) return ASK;
    GroupDefs b = {0};
    int r = 1;
    for (Py_ssize_t k = 0; r == 1 && k < PyList_GET_SIZE(g); k++) {
        PyObject *x = PyList_GET_ITEM(g, k);
        r = get_i64(x, &b.x);
        if (r == 0) r = ASK;
        PyObject *ws = r == 1 ? PyDict_GetItemWithError(defines, x) : NULL;
        if (r == 1 && ws == NULL && PyErr_Occurred()) r = -1;
        b.k = k;
        if (r == 1 && ws != NULL) r = each_define(ws, group_defs_push, &b);
    }
    if (r == 1 && b.n) qsort(b.p, (size_t)b.n, sizeof(GroupDef), group_def_cmp);
    if (r == 1) {
        *res = PyBytes_FromStringAndSize(NULL, b.n * 2 * (Py_ssize_t)sizeof(int64_t));
        if (*res == NULL) r = -1;
        for (Py_ssize_t q = 0; r == 1 && q < b.n; q++) {
            int64_t pair[2] = {b.p[q].w, b.p[q].x};
            memcpy(PyBytes_AS_STRING(*res) + q * (Py_ssize_t)sizeof pair, pair, sizeof pair);
        }
    }
    PyMem_Free(b.p);
    return r;
}

typedef struct {
    int64_t reader, best;
    int found;
} LastBefore;

static int last_before(void *ctx, int64_t w) {
    LastBefore *b = ctx;
    if (w < b->reader && (!b->found || w > b->best)) {
        b->best = w;
        b->found = 1;
    }
    return 0;
}

/* _Matcher.producer(value, reader) from the plan's same-bytes ``groups``
 * (_Storage.same_bytes), its ``defines`` and ``table``, the cache of each asked group's
 * defines (value -> bytes of (position, value) int64 pairs sorted by (position, place in the
 * group), one object per group, made here on the first question about one of its values: a
 * conv net asks about few of its groups): 1 with (*w, *x), 0 for None, ASK, -1. */
static int chain_producer(PyObject *groups, PyObject *table, PyObject *defines, PyObject *value, int64_t reader,
                          int64_t *w, int64_t *x) {
    int64_t v = 0;
    int r = get_i64(value, &v);
    if (r != 1) return r < 0 ? -1 : ASK;
    PyObject *defs = PyDict_GetItemWithError(table, value), *g = NULL;
    if (defs == NULL && PyErr_Occurred()) return -1;
    if (defs == NULL && (g = PyDict_GetItemWithError(groups, value)) == NULL && PyErr_Occurred()) return -1;
    if (g != NULL) {  /* its group's first question */
        PyObject *made = NULL;
        r = group_defs(g, defines, &made);
        for (Py_ssize_t q = 0; r == 1 && q < PyList_GET_SIZE(g); q++)
            if (PyDict_SetItem(table, PyList_GET_ITEM(g, q), made) < 0) r = -1;
        Py_XDECREF(made);  /* (table holds it) */
        if (r != 1) return r;
        if ((defs = PyDict_GetItemWithError(table, value)) == NULL) return PyErr_Occurred() ? -1 : ASK;
    }
    if (defs == NULL) {  /* not in a group: its last define before reader */
        PyObject *ws = PyDict_GetItemWithError(defines, value);
        if (ws == NULL) return PyErr_Occurred() ? -1 : 0;
        LastBefore b = {reader, 0, 0};
        r = each_define(ws, last_before, &b);
        if (r != 1) return r;
        *w = b.best;
        *x = v;
        return b.found;
    }
    if (!PyBytes_CheckExact(defs) || PyBytes_GET_SIZE(defs) % (2 * (Py_ssize_t)sizeof(int64_t))) return ASK;
    const char *base = PyBytes_AS_STRING(defs);
    Py_ssize_t n = PyBytes_GET_SIZE(defs) / (2 * (Py_ssize_t)sizeof(int64_t)), lo = 0, hi = n;
    int64_t pair[2];
#define DEF_AT(q) (memcpy(pair, base + (q) * (Py_ssize_t)sizeof pair, sizeof pair), pair)
    while (lo < hi) {  /* the first define at or after reader */
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (DEF_AT(mid)[0] < reader) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return 0;
    int64_t last = DEF_AT(lo - 1)[0];
    Py_ssize_t first = lo - 1;
    while (first > 0 && DEF_AT(first - 1)[0] == last) first--;
    /* value itself when it is defined there, else the first of the group defined there */
    *w = last;
    *x = DEF_AT(first)[1];
    for (Py_ssize_t q = first; q < lo; q++)
        if (DEF_AT(q)[1] == v) *x = v;
#undef DEF_AT
    return 1;
}

/* producer(groups, table, defines, value, reader, ask) -> _Matcher.producer(value, reader) as
 * chain_producer answers it ((pc, value) or None; ``ask`` where the Python code is to answer;
 * ``table``: a dict it fills, as layout_chain's): for the tests, layout_chain asks
 * chain_producer directly. */
static PyObject *producer(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *groups, *table, *defines, *value, *ask;
    long long reader;
    if (!PyArg_ParseTuple(args, "OOOOLO", &groups, &table, &defines, &value, &reader, &ask)) return NULL;
    if (!PyDict_CheckExact(groups) || !PyDict_CheckExact(table) || !PyDict_CheckExact(defines)) return Py_NewRef(ask);
    int64_t w = 0, x = 0;
    int r = chain_producer(groups, table, defines, value, (int64_t)reader, &w, &x);
    if (r < 0) return NULL;
    if (r == ASK) return Py_NewRef(ask);
    if (r == 0) Py_RETURN_NONE;
    return Py_BuildValue("(LL)", (long long)w, (long long)x);
}

/* A Link (_optimize._Link: a frozen dataclass with slots, no __post_init__) with the fields of
 * ``t`` (pc, src, out, reader, read, ops), made as its __init__ makes one (it sets each slot
 * past the frozen __setattr__), without the six Python calls: a new reference, NULL on an
 * error. */
static PyObject *new_link(PyObject *link_t, PyObject *t) {
    static const char *const fields[6] = {"pc", "src", "out", "reader", "read", "ops"};
    PyTypeObject *tp = (PyTypeObject *)link_t;
    PyObject *obj = tp->tp_alloc(tp, 0);
    for (int k = 0; obj != NULL && k < 6; k++) {
        PyObject *name = PyUnicode_InternFromString(fields[k]);
        if (name == NULL || PyObject_GenericSetAttr(obj, name, PyTuple_GET_ITEM(t, k)) < 0) Py_CLEAR(obj);
        Py_XDECREF(name);
    }
    return obj;
}

/* layout_chain(cur, reader, most, links, groups, table, defines, values, template, to_numpy,
 * Tensor, Link, ask) -> _Matcher.layout_chain's links, nearest first, at most ``most``: Link
 * objects, or (pc, src, out, reader, read, ops) tuples where Link is None; operand ``cur`` read by instruction ``reader``, followed back
 * through producer (chain_producer: ``groups``, ``table`` the plan's cache it fills) and
 * layout_links' table ``links``. ``ask`` when the
 * Python code is to make the chain (a link the table leaves to it, a value of another shape);
 * None when an input is not of the type _Matcher makes. */
static PyObject *layout_chain(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *cur, *links, *groups, *table, *defines, *link_t, *ask;
    long long reader0, most;
    Plan p = {0};
    if (!PyArg_ParseTuple(args, "OLLOOOOOOOOOO", &cur, &reader0, &most, &links, &groups, &table, &defines, &p.values,
                          &p.template_, &p.to_numpy, &p.tensor_t, &link_t, &ask))
        return NULL;
    if (link_t != Py_None && !PyType_Check(link_t)) Py_RETURN_NONE;
    if (!PyList_CheckExact(links) || !PyDict_CheckExact(groups) || !PyDict_CheckExact(table) ||
        !PyDict_CheckExact(defines) ||
        !PyTuple_CheckExact(p.values) || !PyList_CheckExact(p.template_) || !PyDict_CheckExact(p.to_numpy) ||
        !PyType_Check(p.tensor_t))
        Py_RETURN_NONE;
    p.s_val = PyUnicode_InternFromString("val");
    p.s_sizes = PyUnicode_InternFromString("sizes");
    p.s_dyn = PyUnicode_InternFromString("shape_dynamism");
    p.s_st = PyUnicode_InternFromString("scalar_type");
    PyObject *s_r = PyUnicode_InternFromString("R"), *out = PyList_New(0);
    int r = p.s_val && p.s_sizes && p.s_dyn && p.s_st && s_r && out ? 1 : -1;
    int64_t reader = (int64_t)reader0;
    Py_XINCREF(cur);
    while (r == 1 && PyList_GET_SIZE(out) < most) {
        int64_t w = 0, x = 0, c = 0, o = 0;
        r = chain_producer(groups, table, defines, cur, reader, &w, &x);
        if (r != 1) break;
        if (w < 0 || w >= PyList_GET_SIZE(links)) {  /* (not an instruction of the table) */
            r = ASK;
            break;
        }
        PyObject *link = PyList_GET_ITEM(links, w);
        if (link == ask) r = ASK;
        else if (link == Py_None) r = 0;
        else if (!PyTuple_CheckExact(link) || PyTuple_GET_SIZE(link) != 3) r = ASK;
        if (r == 1) r = get_i64(PyTuple_GET_ITEM(link, 1), &o);
        if (r == 1) r = get_i64(cur, &c);  /* (checked by chain_producer) */
        if (r == 1 && !PyLong_CheckExact(PyTuple_GET_ITEM(link, 0))) r = ASK;
        if (r != 1 || o != x) {
            if (r == 0 && link != Py_None) r = ASK;
            break;
        }
        PyObject *ops = Py_NewRef(PyTuple_GET_ITEM(link, 2));
        if (o != c) {  /* read as cur's (static) shape */
            PyObject *dt = NULL, *sizes = NULL, *extra = NULL;
            r = static_tensor(&p, cur, &dt, &sizes);
            if (r == 0) r = ASK;  /* (Python's fails on None: let it) */
            if (r == 1 && !PyTuple_CheckExact(ops)) r = ASK;
            if (r == 1) r = (extra = Py_BuildValue("((OO))", s_r, sizes)) ? 1 : -1;
            Py_SETREF(ops, r == 1 ? PySequence_Concat(ops, extra) : NULL);
            if (r == 1 && ops == NULL) r = -1;
            Py_XDECREF(sizes);
            Py_XDECREF(extra);
        }
        PyObject *t = r == 1 ? Py_BuildValue("(LOOLOO)", (long long)w, PyTuple_GET_ITEM(link, 0), PyTuple_GET_ITEM(link, 1),
                                             (long long)reader, cur, ops) : NULL;
        if (r == 1 && t != NULL && link_t != Py_None) Py_SETREF(t, new_link(link_t, t));
        if (r == 1 && (t == NULL || PyList_Append(out, t) < 0)) r = -1;
        Py_XDECREF(t);
        Py_XDECREF(ops);
        if (r == 1) {
            Py_SETREF(cur, Py_NewRef(PyTuple_GET_ITEM(link, 0)));
            reader = w;
        }
    }
    Py_XDECREF(cur);
    Py_XDECREF(s_r);
    plan_clear(&p);
    if (r == 0 || r == 1) return out;
    Py_XDECREF(out);
    if (r < 0) return NULL;
    return Py_NewRef(ask);
}

/* _Storage.written_between(i, start, stop, skip): whether an instruction strictly between
 * start and stop, not one of skip[0..nskip), may write value i (writes_at: _Storage.writes_at)
 * or memory it shares (regions: _Storage.regions): 1, 0, ASK, -1. */
static int chain_written_between(PyObject *writes_at, PyObject *regions, PyObject *i, int64_t start, int64_t stop,
                                 const int64_t *skip, Py_ssize_t nskip) {
    int64_t iv = 0, ri[3] = {0, 0, 0}, rw[3] = {0, 0, 0};
    int r = get_i64(i, &iv);
    if (r != 1) return r < 0 ? -1 : ASK;
    int planned = region_of(regions, i, ri);
    if (planned < 0 || planned == ASK) return planned;
    for (int64_t pc = start + 1; pc < stop; pc++) {
        int skipped = 0;
        for (Py_ssize_t q = 0; q < nskip && !skipped; q++) skipped = skip[q] == pc;
        if (skipped) continue;
        if (pc < 0 || pc >= PyList_GET_SIZE(writes_at)) return ASK;  /* (Python's raises) */
        PyObject *ws = PyList_GET_ITEM(writes_at, pc);
        if (!PyList_CheckExact(ws)) return ASK;
        for (Py_ssize_t q = 0; q < PyList_GET_SIZE(ws); q++) {
            PyObject *w = PyList_GET_ITEM(ws, q);
            int64_t wv = 0;
            r = get_i64(w, &wv);
            if (r != 1) return r < 0 ? -1 : ASK;
            if (wv == iv) return 1;
            r = planned ? region_of(regions, w, rw) : 0;  /* _Storage.overlap(w, i) */
            if (r < 0 || r == ASK) return r;
            if (r == 1 && rw[0] == ri[0] && rw[1] < ri[2] && ri[1] < rw[2]) return 1;
        }
    }
    return 0;
}

/* A link's int attribute (an exact int of 64 bits): 1, ASK, -1. */
static int link_int(PyObject *ln, PyObject *name, PyObject **obj, int64_t *v) {
    *obj = PyObject_GetAttr(ln, name);
    if (*obj == NULL) return -1;
    int r = get_i64(*obj, v);
    return r == 0 ? ASK : r;
}

#define CHAIN_SKIP 64  /* pcs of copies left out (skip and the chain's) handled here */

/* chain_sources(links, pc, skip, Link, instructions, lists, values, template, written, slots,
 * outputs, inputs, regions, writes_at, to_numpy, Tensor, ndarray, ask) -> _Matcher.chain_sources
 * (links, pc, skip): the tuple of valid lengths; ``ask`` when the Python code is to answer (a
 * link or value of another shape); None when an input is not of the type _Matcher makes. */
static PyObject *chain_sources(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *links, *skip, *link_t, *instructions, *outputs, *inputs, *regions, *writes_at, *ask;
    long long reader_pc;
    Plan p = {0};
    Extra e = {0};
    if (!PyArg_ParseTuple(args, "OLOOOOOOOOOOOOOOOO", &links, &reader_pc, &skip, &link_t, &instructions, &p.lists,
                          &p.values, &p.template_, &p.written, &e.slots, &outputs, &inputs, &regions, &writes_at,
                          &p.to_numpy, &p.tensor_t, &e.ndarray_t, &ask))
        return NULL;
    if (!PyList_CheckExact(links) || !PyAnySet_CheckExact(skip) || !PyType_Check(link_t) ||
        !PyList_CheckExact(instructions) || !PyDict_CheckExact(p.lists) || !PyTuple_CheckExact(p.values) ||
        !PyList_CheckExact(p.template_) || !PyAnySet_CheckExact(p.written) || !PyList_CheckExact(e.slots) ||
        !PyAnySet_CheckExact(outputs) || !PyAnySet_CheckExact(inputs) || !PyDict_CheckExact(regions) ||
        !PyList_CheckExact(writes_at) || !PyDict_CheckExact(p.to_numpy) || !PyType_Check(p.tensor_t) ||
        !PyType_Check(e.ndarray_t))
        Py_RETURN_NONE;
    int64_t pcs[CHAIN_SKIP];  /* skip, then the pcs of the chain's links so far */
    Py_ssize_t npcs = 0;
    int r = PySet_GET_SIZE(skip) + PyList_GET_SIZE(links) <= CHAIN_SKIP ? 1 : ASK;
    if (r == 1) {
        PyObject *it = PyObject_GetIter(skip), *o;
        if (it == NULL) r = -1;
        while (r == 1 && (o = PyIter_Next(it)) != NULL) {
            r = get_i64(o, &pcs[npcs++]);
            if (r == 0) r = ASK;
            Py_DECREF(o);
        }
        Py_XDECREF(it);
        if (r == 1 && PyErr_Occurred()) r = -1;
    }
    p.s_val = PyUnicode_InternFromString("val");
    p.s_sizes = PyUnicode_InternFromString("sizes");
    p.s_dyn = PyUnicode_InternFromString("shape_dynamism");
    p.s_st = PyUnicode_InternFromString("scalar_type");
    PyObject *names[6] = {PyUnicode_InternFromString("pc"), PyUnicode_InternFromString("src"),
                          PyUnicode_InternFromString("out"), PyUnicode_InternFromString("reader"),
                          PyUnicode_InternFromString("read"), PyUnicode_InternFromString("args")};
    if (!p.s_val || !p.s_sizes || !p.s_dyn || !p.s_st) r = -1;
    for (int k = 0; k < 6; k++)
        if (names[k] == NULL) r = -1;
    PyObject *valid = r == 1 ? PyList_New(0) : NULL;
    if (r == 1 && valid == NULL) r = -1;
    for (Py_ssize_t m = 1; r == 1 && m <= PyList_GET_SIZE(links); m++) {
        PyObject *ln = PyList_GET_ITEM(links, m - 1), *o[5] = {NULL, NULL, NULL, NULL, NULL}, *a_args = NULL;
        int64_t v[5] = {0, 0, 0, 0, 0};  /* pc, src, out, reader, read */
        if ((PyObject *)Py_TYPE(ln) != link_t) r = ASK;
        for (int k = 0; r == 1 && k < 5; k++) r = link_int(ln, names[k], &o[k], &v[k]);
        if (r == 1 && (v[3] < 0 || v[3] >= PyList_GET_SIZE(instructions))) r = ASK;
        if (r == 1) r = (a_args = PyObject_GetAttr(PyList_GET_ITEM(instructions, v[3]), names[5])) ? 1 : -1;
        if (r == 1 && !PyTuple_CheckExact(a_args)) r = ASK;
        Py_ssize_t count = 0;
        if (r == 1) r = count_named(&p, a_args, PyTuple_GET_SIZE(a_args), v[4], &count);
        int stop = r == 1 && count != 1;  /* every longer prefix holds this link too */
        if (r == 1 && !stop) {
            int t = PySet_Contains(outputs, o[2]);
            r = t < 0 ? -1 : 1;
            stop = t == 1;
        }
        if (r == 1 && !stop) {
            int t = chain_written_between(writes_at, regions, o[2], v[0], v[3], NULL, 0);
            r = t < 0 || t == ASK ? t : 1;
            stop = t == 1;
        }
        if (r == 1 && !stop) {
            pcs[npcs++] = v[0];
            PyObject *arr = NULL, *dt = NULL, *sizes = NULL;
            int ok = constant(&p, &e, o[1], &arr);
            if (ok == 0) {
                ok = static_tensor(&p, o[1], &dt, &sizes);
                Py_XDECREF(sizes);
                if (ok == 1) {
                    int in = PyDict_Contains(regions, o[1]);
                    if (in == 0) in = PySet_Contains(inputs, o[1]);
                    ok = in;
                }
                if (ok == 1) {
                    int t = chain_written_between(writes_at, regions, o[1], v[0], (int64_t)reader_pc, pcs, npcs);
                    ok = t == 1 ? 0 : t == 0 ? 1 : t;
                }
            }
            if (ok < 0 || ok == ASK) r = ok;
            else if (ok == 1) {
                PyObject *mo = PyLong_FromSsize_t(m);
                if (mo == NULL || PyList_Append(valid, mo) < 0) r = -1;
                Py_XDECREF(mo);
            }
        }
        for (int k = 0; k < 5; k++) Py_XDECREF(o[k]);
        Py_XDECREF(a_args);
        if (stop) break;
    }
    for (int k = 0; k < 6; k++) Py_XDECREF(names[k]);
    plan_clear(&p);
    PyObject *res = r == 1 ? PyList_AsTuple(valid) : NULL;
    Py_XDECREF(valid);
    if (r == 1) return res;
    if (r < 0) return NULL;
    return Py_NewRef(ask);
}

/* ==== end of the layout chains ==== */

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(instructions, rets, lists, ops, KernelCall, MoveCall, FreeCall) -> (mentions, writers, defines, "
     "first_mention, first_write, first_define, pcs left to the caller): a plan's use analysis loop."},
    {"layout", layout, METH_VARARGS,
     "layout(slots) -> (regions, by_mem): _Storage's regions and memories of the planned values."},
    {"writes_at", writes_at, METH_VARARGS,
     "writes_at(writers, n) -> list of n lists of the values each instruction may write, or None."},
    {"reads", reads, METH_VARARGS,
     "reads(mentions, defines, outputs, n) -> value -> positions that may read it, or None."},
    {"mem_reads", mem_reads, METH_VARARGS,
     "mem_reads(entries, reads) -> (positions, first bytes, end bytes (int64 bytes), values), or None."},
    {"own_writes", own_writes, METH_VARARGS,
     "own_writes(entries, rp, rlo, rhi, slots, defines, inputs, dropped) -> (int64 bytes, bool bytes), or None."},
    {"group", group, METH_VARARGS,
     "group(queries, regions, by_mem, numpy_from) -> memory id -> [(first byte, end byte, pc)], or None."},
    {"cover", cover, METH_VARARGS,
     "cover(known, m, qs, rp, rlo, rhi, own, has, size) -> True when it added the covered queries to known, "
     "False when it left them to the caller."},
    {"layout_links", layout_links, METH_VARARGS,
     "layout_links(instructions, rets, lists, values, template, written, regions, op_kinds, to_numpy, KernelCall, "
     "Tensor, Int, Null, ask) -> _Matcher.layout_link of every instruction (ask: the Python code's), or None."},
    {"ew_ops", ew_ops, METH_VARARGS,
     "ew_ops(instructions, rets, lists, values, template, written, slots, op_params, to_numpy, dtypes, KernelCall, "
     "Tensor, Int, Null, ask) -> _Matcher.ew_op of every instruction (ask: the Python code's), or None."},
    {"conv_folds", conv_folds, METH_VARARGS,
     "conv_folds(instructions, rets, lists, values, template, written, slots, mentions, outputs, op_codes, dtypes, "
     "to_numpy, ndarray, KernelCall, Tensor, Int, Null, Bool, Double, ask) -> (convs, statics, folds): _Matcher.conv, "
     "_read_conv_static and batch_norm_fold's checks of every instruction (ask: the Python code's), or None."},
    {"const_copies", const_copies, METH_VARARGS,
     "const_copies(instructions, rets, lists, values, template, written, slots, mentions, writers, outputs, inputs, "
     "copy_ops, nparams, to_numpy, ndarray, KernelCall, DelegateCall, Tensor, Int, Null, Bool, ask) -> the checks of "
     "_constant_copy for every instruction (ask: the Python code's), or None."},
    {"same_bytes", same_bytes, METH_VARARGS,
     "same_bytes(regions, slots) -> value -> its group of values with the same bytes and dtype, or None."},
    {"ew_chain", ew_chain, METH_VARARGS,
     "ew_chain(context, pc, taken) -> _Matcher.ew_chain's (x, ops, dtype), None, or ask (the Python code's)."},
    {"ew_static_ok", ew_static_ok, METH_VARARGS,
     "ew_static_ok(context, x, ops, skip) -> _ew_static_ok's answer for that chain, or ask (the Python code's)."},
    /* ---- layout chains ---- */
    {"producer", producer, METH_VARARGS,
     "producer(groups, table, defines, value, reader, ask) -> _Matcher.producer(value, reader) (ask: the Python "
     "code's)."},
    {"layout_chain", layout_chain, METH_VARARGS,
     "layout_chain(cur, reader, most, links, groups, table, defines, values, template, to_numpy, Tensor, Link, ask) -> "
     "_Matcher.layout_chain's links (ask: the Python code's), or None."},
    {"chain_sources", chain_sources, METH_VARARGS,
     "chain_sources(links, pc, skip, Link, instructions, lists, values, template, written, slots, outputs, inputs, "
     "regions, writes_at, to_numpy, Tensor, ndarray, ask) -> _Matcher.chain_sources (ask: the Python code's), "
     "or None."},
    /* ---- end of layout chains ---- */
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_uses", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__uses(void) { return PyModule_Create(&module); }
