/* prefixscope.replay._native: the two hot loops of sequential replay, in C.
 *
 * 1. sha256_pickle_chain: vLLM's chained block hashes with the sha256 algorithm,
 *    H_i = SHA-256(pickle.dumps((H_{i-1}, tuple(tokens of block i), None), protocol=5))
 *    (vllm/v1/core/kv_cache_utils.py hash_block_tokens, vllm/utils/hashing.py sha256; 0.32.0).
 *    The pickle bytes are written here with the layout of replay/hashing.py
 *    (pickle_block_layout, pickle_block_head) and hashed with OpenSSL's SHA-256, the library
 *    behind CPython's hashlib. Ints outside int64 (or anything not an exact int) are refused
 *    (the caller falls back to pickle.dumps), and nothing is appended then.
 *
 * 2. run_alone: BlockPool.run_alone (replay/block_pool.py) on the pool's own Python lists and
 *    dicts: the same reads and writes in the same order, without the interpreter. The pool's
 *    state stays in Python objects, so every other path (step-by-step, concurrent, the
 *    invariant checks) sees exactly what the Python version leaves.
 *
 * Both are checked against the Python code by tests/test_replay_native.py (hypothesis).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

/* -- 1. chained SHA-256 of vLLM's pickled blocks ------------------------------------------ */

/* Pickle opcodes of one int inside a tuple (CPython's save_long, protocol 5). Returns bytes
 * written to out (at most 11), or 0 when the object is not an exact int within int64. */
static inline int
encode_int(PyObject *o, unsigned char *out)
{
    if (!PyLong_CheckExact(o))
        return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow)
        return 0;
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (v >= 0 && v <= 0xff) {                       /* BININT1 */
        out[0] = 'K';
        out[1] = (unsigned char)v;
        return 2;
    }
    if (v >= 0 && v <= 0xffff) {                     /* BININT2 */
        out[0] = 'M';
        out[1] = (unsigned char)(v & 0xff);
        out[2] = (unsigned char)(v >> 8);
        return 3;
    }
    if (v >= -2147483648LL && v <= 2147483647LL) {   /* BININT, 4 bytes signed LE */
        unsigned long long u = (unsigned long long)v;
        out[0] = 'J';
        for (int i = 0; i < 4; i++)
            out[1 + i] = (unsigned char)(u >> (8 * i));
        return 5;
    }
    /* LONG1: n bytes of two's complement LE, n = bit_length(|v|) // 8 + 1, a negative
     * number's redundant 0xff sign byte dropped (pickle.py encode_long; _pickle.c save_long). */
    unsigned long long mag = v < 0 ? (unsigned long long)(-(v + 1)) + 1ULL
                                   : (unsigned long long)v;
    int bits = 0;
    while (mag) {
        bits++;
        mag >>= 1;
    }
    int n = (bits >> 3) + 1;                          /* 5 .. 9 */
    unsigned char b[9];
    unsigned long long u = (unsigned long long)v;
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(u >> (8 * i));
    b[8] = v < 0 ? 0xff : 0x00;
    if (v < 0 && n > 1 && b[n - 1] == 0xff && (b[n - 2] & 0x80))
        n--;
    out[0] = 0x8a;
    out[1] = (unsigned char)n;
    memcpy(out + 2, b, (size_t)n);
    return 2 + n;
}

PyDoc_STRVAR(sha256_pickle_chain_doc,
"sha256_pickle_chain(keys, tokens, start, num_blocks, block_size, parent, prefix, suffix) -> int\n\n"
"Append to the list ``keys`` the chained SHA-256 digests (32-byte bytes) of ``num_blocks``\n"
"blocks of ``block_size`` tokens of ``tokens`` (a list or tuple of ints) from index\n"
"``start``; the first block's parent is ``parent``. Each digest is\n"
"``sha256(pickle.dumps((parent, tuple(block), None), protocol=5))``, written from the layout\n"
"``head + parent + prefix + token opcodes + suffix`` (replay/hashing.py). Returns\n"
"``num_blocks``, or -1 with ``keys`` unchanged when a token is not an exact int in int64, a\n"
"block is longer than 8,192 tokens or its pickle would take more than one 64 KiB frame\n"
"(the caller then uses pickle.dumps).\n"
"Raises IndexError when the blocks run past the end of ``tokens``.");

static PyObject *
sha256_pickle_chain(PyObject *self, PyObject *args)
{
    PyObject *keys, *tokens;
    Py_ssize_t start, num_blocks, bs;
    Py_buffer parent, prefix, suffix;
    if (!PyArg_ParseTuple(args, "O!Onnny*y*y*", &PyList_Type, &keys, &tokens, &start,
                          &num_blocks, &bs, &parent, &prefix, &suffix))
        return NULL;
    PyObject *result = NULL;
    unsigned char *buf = NULL;
    PyObject *digests = NULL;
    if (!PyList_Check(tokens) && !PyTuple_Check(tokens)) {
        PyErr_SetString(PyExc_TypeError, "tokens must be a list or a tuple");
        goto done;
    }
    if (bs < 1 || num_blocks < 0 || start < 0 || parent.len >= 256) {
        PyErr_SetString(PyExc_ValueError, "block_size >= 1, num_blocks >= 0, start >= 0 and "
                                          "a parent under 256 bytes");
        goto done;
    }
    if (bs > 8192) {
        result = PyLong_FromLong(-1);
        goto done;
    }
    Py_ssize_t ntok = PySequence_Fast_GET_SIZE(tokens);
    if (num_blocks > 0 && (start > ntok || num_blocks > (ntok - start) / bs)) {
        PyErr_SetString(PyExc_IndexError, "blocks run past the end of tokens");
        goto done;
    }
    PyObject **items = PySequence_Fast_ITEMS(tokens);
    /* head (13) + parent + prefix + 11 bytes a token at most + suffix */
    Py_ssize_t cap = 13 + parent.len + prefix.len + 11 * bs + suffix.len;
    buf = PyMem_Malloc((size_t)cap);
    digests = PyList_New(num_blocks);
    if (buf == NULL || digests == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    unsigned char md[SHA256_DIGEST_LENGTH];
    unsigned char *par = (unsigned char *)parent.buf;
    Py_ssize_t plen = parent.len;
    for (Py_ssize_t i = 0; i < num_blocks; i++) {
        unsigned char *p = buf + 13;
        memcpy(p, par, (size_t)plen);
        p += plen;
        memcpy(p, prefix.buf, (size_t)prefix.len);
        p += prefix.len;
        PyObject **t = items + start + i * bs;
        for (Py_ssize_t j = 0; j < bs; j++) {
            int w = encode_int(t[j], p);
            if (w == 0) {  /* not ours to encode: nothing appended */
                result = PyLong_FromLong(-1);
                goto done;
            }
            p += w;
        }
        memcpy(p, suffix.buf, (size_t)suffix.len);
        p += suffix.len;
        /* PROTO 5, FRAME (bytes after its 9-byte header), SHORT_BINBYTES len(parent) */
        unsigned long long frame = (unsigned long long)(p - buf - 11);
        if (frame >= 65536) {  /* past the pickler's FRAME_SIZE_TARGET: several frames */
            result = PyLong_FromLong(-1);
            goto done;
        }
        buf[0] = 0x80;
        buf[1] = 0x05;
        buf[2] = 0x95;
        for (int k = 0; k < 8; k++)
            buf[3 + k] = (unsigned char)(frame >> (8 * k));
        buf[11] = 'C';
        buf[12] = (unsigned char)plen;
        /* The low-level calls: OpenSSL 3's one-shot SHA256() fetches the algorithm through
         * EVP on every call, which costs more than hashing these ~130 bytes. */
        SHA256_CTX ctx;
        SHA256_Init(&ctx);
        SHA256_Update(&ctx, buf, (size_t)(p - buf));
        SHA256_Final(md, &ctx);
        PyObject *d = PyBytes_FromStringAndSize((const char *)md, SHA256_DIGEST_LENGTH);
        if (d == NULL)
            goto done;
        PyList_SET_ITEM(digests, i, d);
        par = (unsigned char *)PyBytes_AS_STRING(d);
        plen = SHA256_DIGEST_LENGTH;
    }
    {
        Py_ssize_t n0 = PyList_GET_SIZE(keys);
        if (PyList_SetSlice(keys, n0, n0, digests) < 0)
            goto done;
    }
    result = PyLong_FromSsize_t(num_blocks);
done:
    Py_XDECREF(digests);
    PyMem_Free(buf);
    PyBuffer_Release(&parent);
    PyBuffer_Release(&prefix);
    PyBuffer_Release(&suffix);
    return result;
}

/* -- 2. BlockPool.run_alone ---------------------------------------------------------------- */

/* The free queue's lists hold block ids as ints, and the sentinels HEAD and TAIL as the ints
 * -2 and -1 (the last two slots, reached by negative indexing in Python). */
typedef struct {
    PyObject *nxt, *prv, *ids, *head_obj, *tail_obj;
    Py_ssize_t n;       /* len(nxt): blocks + 2 */
    Py_ssize_t head, tail;
} Queue;

static inline Py_ssize_t
slot_of(const Queue *q, PyObject *list, Py_ssize_t i)
{
    Py_ssize_t v = PyLong_AsSsize_t(PyList_GET_ITEM(list, i));
    return v < 0 ? v + q->n : v;
}

static inline PyObject *
obj_of(const Queue *q, Py_ssize_t i)
{
    if (i == q->head)
        return q->head_obj;
    if (i == q->tail)
        return q->tail_obj;
    return PyList_GET_ITEM(q->ids, i);
}

static inline void
put(PyObject *list, Py_ssize_t i, PyObject *o)
{
    PyObject *old = PyList_GET_ITEM(list, i);
    Py_INCREF(o);
    PyList_SET_ITEM(list, i, o);
    Py_DECREF(old);
}

static inline void
qlink(const Queue *q, Py_ssize_t a, Py_ssize_t b)  /* nxt[a] = b; prv[b] = a */
{
    put(q->nxt, a, obj_of(q, b));
    put(q->prv, b, obj_of(q, a));
}

static PyObject *MINUS_ONE, *MINUS_TWO;

/* After anything that may run Python code (a key's __hash__/__eq__, drop_duplicate): the lists
 * still have the sizes every index below was checked against. */
#define SIZES_CHANGED(q, bh) (PyList_GET_SIZE((q).nxt) != (q).n || PyList_GET_SIZE((q).prv) != (q).n \
        || PyList_GET_SIZE(bh) < (q).n - 2 || PyList_GET_SIZE((q).ids) < (q).n - 2)
#define CHECK_SIZES(q, bh) do { if (SIZES_CHANGED(q, bh)) { \
        PyErr_SetString(PyExc_RuntimeError, "run_alone: the pool's lists changed during the call"); \
        goto done; } } while (0)

PyDoc_STRVAR(run_alone_doc,
"run_alone(nxt, prv, block_hash, first, dups, ids, keys, num_lookup, num_blocks, num_keyed,\n"
"          drop_duplicate) -> (hit_blocks, evicted_blocks)\n\n"
"BlockPool.run_alone (replay/block_pool.py) on the pool's lists and dicts: lookup of\n"
"keys[:num_lookup] up to the first miss, the hits out of the free queue, num_blocks - hits\n"
"new blocks popped from the front (their old keys evicted), keys[hits:num_keyed] registered\n"
"on the first of them, and every block back in the queue as free_blocks(reversed(blocks))\n"
"leaves it. ``ids[i]`` is the int object of block i; ``drop_duplicate(b, key)`` is\n"
"BlockPool._drop_duplicate (keys with several blocks). The caller checks the preconditions\n"
"(idle bounded pool, 0 <= num_lookup <= num_keyed <= num_blocks <= free blocks); the\n"
"sizes are checked here again (ValueError).");

static PyObject *
run_alone(PyObject *self, PyObject *args)
{
    PyObject *nxt, *prv, *bh, *first, *dups, *ids, *keys, *drop;
    Py_ssize_t num_lookup, num_blocks, num_keyed;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!nnnO", &PyList_Type, &nxt, &PyList_Type, &prv,
                          &PyList_Type, &bh, &PyDict_Type, &first, &PyDict_Type, &dups,
                          &PyList_Type, &ids, &PyList_Type, &keys, &num_lookup, &num_blocks,
                          &num_keyed, &drop))
        return NULL;
    Queue q = {nxt, prv, ids, MINUS_TWO, MINUS_ONE, PyList_GET_SIZE(nxt), 0, 0};
    q.head = q.n - 2;
    q.tail = q.n - 1;
    if (q.n < 3 || PyList_GET_SIZE(prv) != q.n || PyList_GET_SIZE(bh) < q.n - 2
            || PyList_GET_SIZE(ids) < q.n - 2 || !(0 <= num_lookup && num_lookup <= num_keyed
            && num_keyed <= num_blocks && num_blocks <= q.n - 3)
            || PyList_GET_SIZE(keys) < num_keyed) {
        PyErr_SetString(PyExc_ValueError, "run_alone: sizes out of range");
        return NULL;
    }
    Py_ssize_t *hits = NULL, *blocks = NULL;
    PyObject **olds = NULL;
    Py_ssize_t nh = 0, nold = 0, evicted = 0;
    PyObject *result = NULL;
    /* Our own copy of the keys: a key's __hash__ or __eq__ (Python code) cannot shrink it. */
    keys = PyList_GetSlice(keys, 0, num_keyed);
    if (keys == NULL)
        return NULL;
    hits = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(num_lookup + 1));
    blocks = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(num_blocks + 1));
    olds = PyMem_Malloc(sizeof(PyObject *) * (size_t)(num_blocks + 1));
    if (!hits || !blocks || !olds) {
        PyErr_NoMemory();
        goto done;
    }
    /* Lookup (vLLM get_computed_blocks) up to the first miss. */
    for (Py_ssize_t i = 0; i < num_lookup; i++) {
        PyObject *b = PyDict_GetItemWithError(first, PyList_GET_ITEM(keys, i));
        if (b == NULL) {
            if (PyErr_Occurred())
                goto done;
            break;
        }
        Py_ssize_t hb = PyLong_AsSsize_t(b);
        if (hb <= 0 || hb >= q.n - 2) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_RuntimeError, "run_alone: the map names block %zd", hb);
            goto done;
        }
        hits[nh++] = hb;
    }
    CHECK_SIZES(q, bh);
    /* Touch: the hits leave the free queue. A block hit twice (a key repeated among the
     * request's hits: keys that do not name their whole prefix) is no longer linked when it
     * comes again; then every hit goes back where it was (in reverse, exactly) and the call
     * fails, leaving the pool as it was. */
    for (Py_ssize_t i = 0; i < nh; i++) {
        Py_ssize_t b = hits[i];
        Py_ssize_t p = slot_of(&q, prv, b), n = slot_of(&q, nxt, b);
        if (slot_of(&q, nxt, p) != b) {
            for (Py_ssize_t j = i - 1; j >= 0; j--) {
                Py_ssize_t u = hits[j];
                Py_ssize_t up = slot_of(&q, prv, u), un = slot_of(&q, nxt, u);
                qlink(&q, up, u);
                qlink(&q, u, un);
            }
            PyErr_SetString(PyExc_ValueError, "run_alone: a block key repeats among the "
                            "request's hits (block keys must name their whole prefix)");
            goto done;
        }
        qlink(&q, p, n);
    }
    Py_ssize_t nk = num_keyed - nh;
    /* Pop the new blocks and link them as free_blocks(reversed(blocks)) leaves them:
     * ... R's last, new[nk-1], ..., new[0], hits[-1], ..., hits[0] at the back; key-less new
     * blocks to the front. */
    Py_ssize_t r_last = slot_of(&q, prv, q.tail);
    Py_ssize_t prev = q.tail;
    for (Py_ssize_t i = 0; i < nh; i++) {
        qlink(&q, hits[i], prev);
        prev = hits[i];
    }
    Py_ssize_t b = slot_of(&q, nxt, q.head);
    for (Py_ssize_t i = 0; i < nk; i++) {
        if (b >= q.head)
            goto ran_out;
        Py_ssize_t after = slot_of(&q, nxt, b);
        qlink(&q, b, prev);
        PyObject *key = PyList_GET_ITEM(keys, nh + i);
        olds[nold++] = PyList_GET_ITEM(bh, b);  /* the list's reference moves here */
        Py_INCREF(key);
        PyList_SET_ITEM(bh, b, key);
        blocks[i] = b;
        prev = b;
        b = after;
    }
    Py_ssize_t nu = num_blocks - num_keyed;
    for (Py_ssize_t i = 0; i < nu; i++) {
        if (b >= q.head)
            goto ran_out;
        blocks[nk + i] = b;
        olds[nold++] = PyList_GET_ITEM(bh, b);
        Py_INCREF(Py_None);
        PyList_SET_ITEM(bh, b, Py_None);
        b = slot_of(&q, nxt, b);
    }
    if (b == q.tail) {  /* R is empty */
        qlink(&q, q.head, prev);
    } else {
        qlink(&q, q.head, b);
        qlink(&q, r_last, prev);
    }
    if (nu) {  /* prepend_n(unkeyed[::-1]); the free count does not change */
        Py_ssize_t front = slot_of(&q, nxt, q.head);
        Py_ssize_t last = q.head;
        for (Py_ssize_t i = nu - 1; i >= 0; i--) {
            qlink(&q, last, blocks[nk + i]);
            last = blocks[nk + i];
        }
        qlink(&q, last, front);
    }
    /* Eviction of the old keys (invariant 4), then registration of the new ones. */
    int any_dup = 0;
    for (Py_ssize_t i = 0; i < nold; i++) {
        if (olds[i] == Py_None)
            continue;
        evicted++;
        if (!any_dup && PyDict_GET_SIZE(dups)) {
            int c = PyDict_Contains(dups, olds[i]);
            if (c < 0)
                goto done;
            any_dup = c;
        }
    }
    CHECK_SIZES(q, bh);
    for (Py_ssize_t i = 0; i < nold; i++) {
        PyObject *old = olds[i];
        if (old == Py_None)
            continue;
        int c = 0;
        if (any_dup && (c = PyDict_Contains(dups, old)) < 0)
            goto done;
        if (c) {
            PyObject *r = PyObject_CallFunctionObjArgs(drop, obj_of(&q, blocks[i]), old, NULL);
            if (r == NULL)
                goto done;
            Py_DECREF(r);
        } else if (PyDict_DelItem(first, old) < 0) {
            if (any_dup || !PyErr_ExceptionMatches(PyExc_KeyError))
                goto done;
            PyErr_Clear();  /* as first.pop(old, None) */
        }
        CHECK_SIZES(q, bh);
    }
    for (Py_ssize_t i = 0; i < nk; i++) {
        PyObject *key = PyList_GET_ITEM(keys, nh + i);
        CHECK_SIZES(q, bh);
        PyObject *bo = obj_of(&q, blocks[i]);
        Py_INCREF(bo);  /* held across the calls below, which may run a key's Python code */
        PyObject *got = PyDict_SetDefault(first, key, bo);
        if (got == NULL) {
            Py_DECREF(bo);
            goto done;
        }
        if (got != bo && PyLong_AsSsize_t(got) != blocks[i]) {  /* a duplicate */
            PyObject *lst = PyDict_GetItemWithError(dups, key);
            if (lst == NULL) {
                if (PyErr_Occurred()) {
                    Py_DECREF(bo);
                    goto done;
                }
                lst = PyList_New(0);  /* our reference, kept until the append */
                if (lst == NULL || PyDict_SetItem(dups, key, lst) < 0) {
                    Py_XDECREF(lst);
                    Py_DECREF(bo);
                    goto done;
                }
            } else {
                Py_INCREF(lst);
            }
            int bad = PyList_Append(lst, bo);
            Py_DECREF(lst);
            if (bad < 0) {
                Py_DECREF(bo);
                goto done;
            }
        }
        Py_DECREF(bo);
    }
    result = Py_BuildValue("nn", nh, evicted);
    goto done;
ran_out:  /* only when the caller broke the preconditions (a pool with blocks in use) */
    PyErr_SetString(PyExc_RuntimeError, "run_alone: the free queue ran out (is the pool idle?)");
done:
    if (olds)
        for (Py_ssize_t i = 0; i < nold; i++)
            Py_DECREF(olds[i]);
    PyMem_Free(hits);
    PyMem_Free(blocks);
    PyMem_Free(olds);
    Py_DECREF(keys);
    return result;
}

static PyMethodDef methods[] = {
    {"sha256_pickle_chain", sha256_pickle_chain, METH_VARARGS, sha256_pickle_chain_doc},
    {"run_alone", run_alone, METH_VARARGS, run_alone_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native",
    "The hot loops of sequential replay in C (block hashing, BlockPool.run_alone); "
    "see prefixscope.replay.native.", -1, methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    MINUS_ONE = PyLong_FromLong(-1);
    MINUS_TWO = PyLong_FromLong(-2);
    if (MINUS_ONE == NULL || MINUS_TWO == NULL)
        return NULL;
    return PyModule_Create(&module);
}
