/* orchestra.runtime._uses: the per-instruction loop of a plan's use analysis
 * (orchestra/runtime/_optimize.py, analyse_uses) in C.
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
 * the caller handles. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

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

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(instructions, rets, lists, ops, KernelCall, MoveCall, FreeCall) -> (mentions, writers, defines, "
     "first_mention, first_write, first_define, pcs left to the caller): a plan's use analysis loop."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_uses", NULL, -1, methods};

PyMODINIT_FUNC PyInit__uses(void) { return PyModule_Create(&module); }
