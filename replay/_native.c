/* prefixscope.replay._native: the hot loops of sequential replay, in C.
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
 * 3-5 (issue 26): the miss ledger's content index (ContentIndex) and its run of blocks stored
 *    before (stored_run), Belady's MIN for the capacity sweep (min_hits) and the sweep's key
 *    interning (intern_keys); their Python references are in replay/ledger.py and
 *    replay/belady.py.
 *
 * All are checked against the Python code by tests/test_replay_native.py (hypothesis).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
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


/* -- 3. the miss ledger's content index ------------------------------------------------------ */

/* ContentIndex: a set of 64-bit block content keys (replay/ledger.py _block_hashes: the random
 * linear hash sum_i tokens[j*B + i] * coef[i] + salt mod 2^64), open addressing with linear
 * probing. The keys are computed here from the token list, so a block costs a few
 * multiply-adds and one probe, with no Python int or set entry per block. The Python
 * reference (replay/ledger.py _PyContentIndex: the same keys in a set of ints) must give the
 * same counts (tests/test_replay_native.py). */

typedef struct {
    PyObject_HEAD
    uint64_t *slots;   /* 0 = empty; the key 0 is held by has_zero */
    uint32_t *stamps;  /* per slot: the count_add call that entered the key */
    uint32_t zero_stamp, epoch;
    Py_ssize_t mask;   /* len(slots) - 1, a power of two minus one */
    Py_ssize_t used;   /* keys in slots (has_zero not counted) */
    int has_zero;
} ContentIndex;

static inline Py_ssize_t
ci_slot(uint64_t v, Py_ssize_t mask)
{
    return (Py_ssize_t)((v * 0x9E3779B97F4A7C15ULL) >> 17) & mask;
}

static inline int
ci_contains(const ContentIndex *s, uint64_t v)
{
    if (v == 0)
        return s->has_zero;
    Py_ssize_t i = ci_slot(v, s->mask);
    for (;;) {
        uint64_t x = s->slots[i];
        if (x == v)
            return 1;
        if (x == 0)
            return 0;
        i = (i + 1) & s->mask;
    }
}

static int
ci_grow(ContentIndex *s)
{
    Py_ssize_t n = (s->mask + 1) * 2;
    uint64_t *ns = PyMem_Calloc((size_t)n, sizeof(uint64_t));
    uint32_t *nt = PyMem_Malloc((size_t)n * sizeof(uint32_t));
    if (ns == NULL || nt == NULL) {
        PyMem_Free(ns);
        PyMem_Free(nt);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k <= s->mask; k++) {
        uint64_t v = s->slots[k];
        if (v == 0)
            continue;
        Py_ssize_t i = ci_slot(v, n - 1);
        while (ns[i] != 0)
            i = (i + 1) & (n - 1);
        ns[i] = v;
        nt[i] = s->stamps[k];
    }
    PyMem_Free(s->slots);
    PyMem_Free(s->stamps);
    s->slots = ns;
    s->stamps = nt;
    s->mask = n - 1;
    return 0;
}

/* Enter v (stamped ``stamp`` when new). Returns 1 when v was held under another stamp (entered
 * by an earlier call), 0 when it is new or entered under this stamp, -1 on error. */
static inline int
ci_add(ContentIndex *s, uint64_t v, uint32_t stamp)
{
    if (v == 0) {
        if (s->has_zero)
            return s->zero_stamp != stamp;
        s->has_zero = 1;
        s->zero_stamp = stamp;
        return 0;
    }
    if ((s->used + 1) * 2 > s->mask + 1 && ci_grow(s) < 0)
        return -1;
    Py_ssize_t i = ci_slot(v, s->mask);
    for (;;) {
        uint64_t x = s->slots[i];
        if (x == v)
            return s->stamps[i] != stamp;
        if (x == 0) {
            s->slots[i] = v;
            s->stamps[i] = stamp;
            s->used++;
            return 0;
        }
        i = (i + 1) & s->mask;
    }
}

static PyObject *
ci_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    if (!PyArg_ParseTuple(args, ""))
        return NULL;
    ContentIndex *s = (ContentIndex *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    s->slots = PyMem_Calloc(1024, sizeof(uint64_t));
    s->stamps = PyMem_Calloc(1024, sizeof(uint32_t));
    if (s->slots == NULL || s->stamps == NULL) {
        Py_DECREF(s);
        return PyErr_NoMemory();
    }
    s->mask = 1023;
    return (PyObject *)s;
}

static void
ci_dealloc(ContentIndex *s)
{
    PyMem_Free(s->slots);
    PyMem_Free(s->stamps);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static Py_ssize_t
ci_len(ContentIndex *s)
{
    return s->used + s->has_zero;
}

static Py_ssize_t
content_keys(PyObject *tokens, Py_ssize_t start, Py_ssize_t stop, Py_ssize_t bs,
             Py_buffer *coef, uint64_t salt, uint64_t **out)
{
    *out = NULL;
    if (!PyList_Check(tokens) && !PyTuple_Check(tokens)) {
        PyErr_SetString(PyExc_TypeError, "tokens must be a list or a tuple");
        return -1;
    }
    if (bs < 1 || start < 0 || coef->len < (Py_ssize_t)(bs * sizeof(uint64_t))) {
        PyErr_SetString(PyExc_ValueError, "block_size >= 1, start >= 0, a coefficient a token");
        return -1;
    }
    if (stop <= start)
        return 0;
    Py_ssize_t ntok = PySequence_Fast_GET_SIZE(tokens);
    if (stop > ntok / bs) {
        PyErr_SetString(PyExc_IndexError, "blocks run past the end of tokens");
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(tokens);
    const uint64_t *c = (const uint64_t *)coef->buf;
    uint64_t *keys = PyMem_Malloc((size_t)(stop - start) * sizeof(uint64_t));
    if (keys == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t b = start; b < stop; b++) {
        uint64_t h = 0;
        PyObject **t = items + b * bs;
        for (Py_ssize_t i = 0; i < bs; i++) {
            int overflow = 0;
            long long v = PyLong_Check(t[i]) ? PyLong_AsLongLongAndOverflow(t[i], &overflow)
                                             : (PyErr_SetString(PyExc_TypeError,
                                                                "tokens must be ints"), -1);
            if (overflow) {
                PyErr_SetString(PyExc_OverflowError, "a token id outside int64");
                PyMem_Free(keys);
                return -1;
            }
            if (v == -1 && PyErr_Occurred()) {
                PyMem_Free(keys);
                return -1;
            }
            h += (uint64_t)v * c[i];
        }
        keys[b - start] = h + salt;
    }
    *out = keys;
    return stop - start;
}

PyDoc_STRVAR(ci_count_doc,
"count(tokens, start, stop, block_size, coef, salt) -> (n_in, first_in)\n\n"
"How many of the content keys of blocks start .. stop-1 of ``tokens`` the index holds, and\n"
"whether the first one is held (False when there are none). ``coef``: block_size uint64\n"
"multipliers (native byte order); ``salt``: added mod 2^64.");

static PyObject *
ci_count(ContentIndex *s, PyObject *args)
{
    PyObject *tokens;
    Py_ssize_t start, stop, bs;
    Py_buffer coef;
    unsigned long long salt;
    if (!PyArg_ParseTuple(args, "Onnny*K", &tokens, &start, &stop, &bs, &coef, &salt))
        return NULL;
    uint64_t *keys;
    Py_ssize_t n = content_keys(tokens, start, stop, bs, &coef, (uint64_t)salt, &keys);
    PyBuffer_Release(&coef);
    if (n < 0)
        return NULL;
    Py_ssize_t hits = 0;
    int first = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        int in = ci_contains(s, keys[k]);
        hits += in;
        if (k == 0)
            first = in;
    }
    PyMem_Free(keys);
    return Py_BuildValue("nO", hits, first ? Py_True : Py_False);
}

PyDoc_STRVAR(ci_add_doc,
"add(tokens, start, stop, block_size, coef, salt) -> None\n\n"
"Add the content keys of blocks start .. stop-1 of ``tokens`` (arguments as count).");

static PyObject *
ci_add_blocks(ContentIndex *s, PyObject *args)
{
    PyObject *tokens;
    Py_ssize_t start, stop, bs;
    Py_buffer coef;
    unsigned long long salt;
    if (!PyArg_ParseTuple(args, "Onnny*K", &tokens, &start, &stop, &bs, &coef, &salt))
        return NULL;
    uint64_t *keys;
    Py_ssize_t n = content_keys(tokens, start, stop, bs, &coef, (uint64_t)salt, &keys);
    PyBuffer_Release(&coef);
    if (n < 0)
        return NULL;
    uint32_t stamp = ++s->epoch;
    for (Py_ssize_t k = 0; k < n; k++)
        if (ci_add(s, keys[k], stamp) < 0) {
            PyMem_Free(keys);
            return NULL;
        }
    PyMem_Free(keys);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(ci_count_add_doc,
"count_add(tokens, start, stop, count_from, count_to, block_size, coef, salt)\n"
"    -> (n_in, first_in)\n\n"
"count(tokens, count_from, count_to, ...) then add(tokens, start, stop, ...), in one pass\n"
"(start <= count_from <= count_to <= stop): a block counts when an earlier call entered its\n"
"key, not when an earlier block of this call did.");

static PyObject *
ci_count_add(ContentIndex *s, PyObject *args)
{
    PyObject *tokens;
    Py_ssize_t start, stop, cfrom, cto, bs;
    Py_buffer coef;
    unsigned long long salt;
    if (!PyArg_ParseTuple(args, "Onnnnny*K", &tokens, &start, &stop, &cfrom, &cto, &bs, &coef,
                          &salt))
        return NULL;
    if (!(start <= cfrom && cfrom <= cto && cto <= stop) && cfrom < cto) {
        PyBuffer_Release(&coef);
        PyErr_SetString(PyExc_ValueError, "count_add: start <= count_from <= count_to <= stop");
        return NULL;
    }
    uint64_t *keys;
    Py_ssize_t n = content_keys(tokens, start, stop, bs, &coef, (uint64_t)salt, &keys);
    PyBuffer_Release(&coef);
    if (n < 0)
        return NULL;
    uint32_t stamp = ++s->epoch;
    Py_ssize_t hits = 0;
    int first = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        int in = ci_add(s, keys[k], stamp);
        if (in < 0) {
            PyMem_Free(keys);
            return NULL;
        }
        Py_ssize_t b = start + k;
        if (b >= cfrom && b < cto) {
            hits += in;
            if (b == cfrom)
                first = in;
        }
    }
    PyMem_Free(keys);
    return Py_BuildValue("nO", hits, first ? Py_True : Py_False);
}

static PyMethodDef ci_methods[] = {
    {"count", (PyCFunction)ci_count, METH_VARARGS, ci_count_doc},
    {"add", (PyCFunction)ci_add_blocks, METH_VARARGS, ci_add_doc},
    {"count_add", (PyCFunction)ci_count_add, METH_VARARGS, ci_count_add_doc},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods ci_as_sequence = {
    .sq_length = (lenfunc)ci_len,
};

static PyTypeObject ContentIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "prefixscope.replay._native.ContentIndex",
    .tp_doc = "The miss ledger's content index: a set of 64-bit block content keys.",
    .tp_basicsize = sizeof(ContentIndex),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = ci_new,
    .tp_dealloc = (destructor)ci_dealloc,
    .tp_methods = ci_methods,
    .tp_as_sequence = &ci_as_sequence,
};

/* -- 4. Belady's MIN for the capacity sweep ----------------------------------------------------- */

/* min_hits: replay/belady.py _min_hits_python (and compute_next_use) over the interned keys:
 * the same evictions in the same order (the cached block with the largest (next use << 20 |
 * depth, key) first, the request's hits pinned), with arrays indexed by key instead of dicts
 * and a binary heap of (priority, key) pairs with lazy deletion. */

typedef struct {
    uint64_t prio;
    uint32_t key;
} HeapEntry;

static inline int
he_gt(HeapEntry a, HeapEntry b)
{
    return a.prio > b.prio || (a.prio == b.prio && a.key > b.key);
}

static void
heap_up(HeapEntry *h, Py_ssize_t i)
{
    HeapEntry e = h[i];
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!he_gt(e, h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static void
heap_down(HeapEntry *h, Py_ssize_t n, Py_ssize_t i)
{
    HeapEntry e = h[i];
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && he_gt(h[c + 1], h[c]))
            c++;
        if (!he_gt(h[c], e))
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = e;
}

PyDoc_STRVAR(min_hits_doc,
"min_hits(keys, num_lookup, num_blocks, cap) -> list of hit blocks per request (-1: skipped)\n\n"
"Belady's MIN over an AccessTrace (replay/belady.py): ``keys`` a list of lists of ints in\n"
"[0, 2^32) (under 2^31: interned keys; from 2^31: fresh decode keys), ``cap`` the usable\n"
"blocks (num_gpu_blocks - 1). Requests with num_blocks > cap are skipped (-1).");

#define FRESH_BASE 0x80000000ULL

static PyObject *
min_hits(PyObject *self, PyObject *args)
{
    PyObject *keys_l, *nl_l, *nb_l;
    Py_ssize_t cap;
    if (!PyArg_ParseTuple(args, "O!O!O!n", &PyList_Type, &keys_l, &PyList_Type, &nl_l,
                          &PyList_Type, &nb_l, &cap))
        return NULL;
    Py_ssize_t R = PyList_GET_SIZE(keys_l);
    if (PyList_GET_SIZE(nl_l) != R || PyList_GET_SIZE(nb_l) != R) {
        PyErr_SetString(PyExc_ValueError, "min_hits: lists of different lengths");
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t *off = NULL, *nl = NULL, *nb = NULL;
    uint32_t *kx = NULL;       /* flat keys, as slots */
    int64_t *nu = NULL;        /* flat next use (R = never) */
    int64_t *nxt = NULL;       /* per slot: next request looking it up */
    int64_t *res = NULL;       /* per slot: resident priority, -1 = not resident */
    int32_t *pin = NULL;       /* per slot: request index + 1 while pinned */
    HeapEntry *heap = NULL, *kept = NULL;
    Py_ssize_t hn = 0, hcap = 0;
    off = PyMem_Malloc((size_t)(R + 1) * sizeof(Py_ssize_t));
    nl = PyMem_Malloc((size_t)(R + 1) * sizeof(Py_ssize_t));
    nb = PyMem_Malloc((size_t)(R + 1) * sizeof(Py_ssize_t));
    if (!off || !nl || !nb) {
        PyErr_NoMemory();
        goto done;
    }
    off[0] = 0;
    uint64_t max_dense = 0, max_fresh = 0;
    int any_dense = 0, any_fresh = 0;
    for (Py_ssize_t r = 0; r < R; r++) {
        PyObject *kl = PyList_GET_ITEM(keys_l, r);
        if (!PyList_Check(kl)) {
            PyErr_SetString(PyExc_TypeError, "min_hits: keys must be lists");
            goto done;
        }
        Py_ssize_t n = PyList_GET_SIZE(kl);
        nl[r] = PyLong_AsSsize_t(PyList_GET_ITEM(nl_l, r));
        nb[r] = PyLong_AsSsize_t(PyList_GET_ITEM(nb_l, r));
        if (PyErr_Occurred())
            goto done;
        if (nl[r] < 0 || nl[r] > n || n >= (1 << 20)) {
            PyErr_SetString(PyExc_ValueError, "min_hits: 0 <= num_lookup <= len(keys) < 2^20");
            goto done;
        }
        off[r + 1] = off[r] + n;
    }
    Py_ssize_t total = off[R];
    kx = PyMem_Malloc((size_t)(total + 1) * sizeof(uint32_t));
    nu = PyMem_Malloc((size_t)(total + 1) * sizeof(int64_t));
    if (!kx || !nu) {
        PyErr_NoMemory();
        goto done;
    }
    /* keys -> slots: under 2^31 the key itself, from 2^31 after the largest such key */
    for (Py_ssize_t r = 0; r < R; r++) {
        PyObject *kl = PyList_GET_ITEM(keys_l, r);
        Py_ssize_t n = off[r + 1] - off[r];
        if (PyList_GET_SIZE(kl) != n) {
            PyErr_SetString(PyExc_RuntimeError, "min_hits: a key list changed");
            goto done;
        }
        for (Py_ssize_t j = 0; j < n; j++) {
            unsigned long long v = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(kl, j));
            if (v == (unsigned long long)-1 && PyErr_Occurred())
                goto done;
            if (v >= (1ULL << 32)) {
                PyErr_SetString(PyExc_ValueError, "min_hits: keys must be below 2^32");
                goto done;
            }
            if (v < FRESH_BASE) {
                any_dense = 1;
                if (v > max_dense)
                    max_dense = v;
            } else {
                any_fresh = 1;
                if (v - FRESH_BASE > max_fresh)
                    max_fresh = v - FRESH_BASE;
            }
            kx[off[r] + j] = (uint32_t)v;
        }
    }
    Py_ssize_t ndense = any_dense ? (Py_ssize_t)max_dense + 1 : 0;
    Py_ssize_t nslots = ndense + (any_fresh ? (Py_ssize_t)max_fresh + 1 : 0);
    nxt = PyMem_Malloc((size_t)(nslots + 1) * sizeof(int64_t));
    res = PyMem_Malloc((size_t)(nslots + 1) * sizeof(int64_t));
    pin = PyMem_Calloc((size_t)(nslots + 1), sizeof(int32_t));
    if (!nxt || !res || !pin) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < total; k++) {
        uint32_t v = kx[k];
        uint32_t sl = v < FRESH_BASE ? v : (uint32_t)(ndense + (v - FRESH_BASE));
        kx[k] = sl;
    }
    /* next use (compute_next_use): one backward pass, skipping requests the cache cannot hold */
    for (Py_ssize_t k = 0; k < nslots; k++) {
        nxt[k] = R;
        res[k] = -1;
    }
    for (Py_ssize_t r = R - 1; r >= 0; r--) {
        if (nb[r] > cap)
            continue;
        for (Py_ssize_t j = off[r]; j < off[r + 1]; j++)
            nu[j] = nxt[kx[j]];
        for (Py_ssize_t j = off[r]; j < off[r] + nl[r]; j++)
            nxt[kx[j]] = r;
    }
    result = PyList_New(R);
    if (result == NULL)
        goto done;
    Py_ssize_t nres = 0, nkept = 0, kcap = 0;
    for (Py_ssize_t r = 0; r < R; r++) {
        if (nb[r] > cap) {
            PyList_SET_ITEM(result, r, PyLong_FromLong(-1));
            continue;
        }
        const uint32_t *ks = kx + off[r];
        Py_ssize_t n = off[r + 1] - off[r];
        Py_ssize_t h = 0;
        while (h < nl[r] && res[ks[h]] >= 0)
            h++;
        PyObject *hv = PyLong_FromSsize_t(h);
        if (hv == NULL)
            goto fail;
        PyList_SET_ITEM(result, r, hv);
        Py_ssize_t need = (nb[r] - h) - (cap - nres);
        if (need > 0) {
            for (Py_ssize_t j = 0; j < h; j++)
                pin[ks[j]] = (int32_t)(r + 1);
            nkept = 0;
            while (need > 0) {
                if (hn == 0) {
                    PyErr_SetString(PyExc_RuntimeError, "min_hits: nothing left to evict");
                    goto fail;
                }
                HeapEntry e = heap[0];
                heap[0] = heap[--hn];
                if (hn)
                    heap_down(heap, hn, 0);
                uint32_t sl = e.key;
                if (res[sl] != (int64_t)e.prio)
                    continue;  /* stale */
                if (pin[sl] == (int32_t)(r + 1)) {
                    if (nkept == kcap) {
                        kcap = kcap ? 2 * kcap : 64;
                        HeapEntry *nk = PyMem_Realloc(kept, (size_t)kcap * sizeof(HeapEntry));
                        if (nk == NULL) {
                            PyErr_NoMemory();
                            goto fail;
                        }
                        kept = nk;
                    }
                    kept[nkept++] = e;
                    continue;
                }
                res[sl] = -1;
                nres--;
                need--;
            }
            for (Py_ssize_t k = 0; k < nkept; k++) {
                heap[hn] = kept[k];  /* room: they were popped from the heap */
                heap_up(heap, hn++);
            }
        }
        for (Py_ssize_t j = 0; j < n; j++) {
            int64_t u = nu[off[r] + j];
            int64_t prio = (u << 20) | j;
            uint32_t sl = ks[j];
            if (res[sl] != prio) {
                if (res[sl] < 0)
                    nres++;
                res[sl] = prio;
                if (hn == hcap) {
                    hcap = hcap ? 2 * hcap : 1024;
                    HeapEntry *nh = PyMem_Realloc(heap, (size_t)hcap * sizeof(HeapEntry));
                    if (nh == NULL) {
                        PyErr_NoMemory();
                        goto fail;
                    }
                    heap = nh;
                }
                heap[hn].prio = (uint64_t)prio;
                heap[hn].key = sl;
                heap_up(heap, hn++);
            }
        }
        if (hn > 4 * nres + 1024) {  /* drop stale entries */
            hn = 0;
            for (Py_ssize_t k = 0; k < nslots; k++)
                if (res[k] >= 0) {
                    heap[hn].prio = (uint64_t)res[k];
                    heap[hn].key = (uint32_t)k;
                    hn++;
                }
            for (Py_ssize_t i = hn / 2 - 1; i >= 0; i--)
                heap_down(heap, hn, i);
        }
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    PyMem_Free(off);
    PyMem_Free(nl);
    PyMem_Free(nb);
    PyMem_Free(kx);
    PyMem_Free(nu);
    PyMem_Free(nxt);
    PyMem_Free(res);
    PyMem_Free(pin);
    PyMem_Free(heap);
    PyMem_Free(kept);
    return result;
}

PyDoc_STRVAR(intern_keys_doc,
"intern_keys(intern, keys, n) -> list of ints\n\n"
"The ids of keys[:n] in the dict ``intern`` (key -> id), a key not in it getting the next id,\n"
"len(intern), and entered: replay/belady.py collect_accesses's loop.");

static PyObject *
intern_keys(PyObject *self, PyObject *args)
{
    PyObject *intern, *keys;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "O!O!n", &PyDict_Type, &intern, &PyList_Type, &keys, &n))
        return NULL;
    if (n < 0 || n > PyList_GET_SIZE(keys)) {
        PyErr_SetString(PyExc_ValueError, "intern_keys: 0 <= n <= len(keys)");
        return NULL;
    }
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (j >= PyList_GET_SIZE(keys)) {  /* a key's __eq__ shrank the list */
            PyErr_SetString(PyExc_RuntimeError, "intern_keys: the keys changed");
            goto fail;
        }
        PyObject *k = PyList_GET_ITEM(keys, j);
        Py_INCREF(k);
        PyObject *v = PyDict_GetItemWithError(intern, k);
        if (v != NULL) {
            Py_INCREF(v);
        } else {
            if (PyErr_Occurred()) {
                Py_DECREF(k);
                goto fail;
            }
            v = PyLong_FromSsize_t(PyDict_GET_SIZE(intern));
            if (v == NULL || PyDict_SetItem(intern, k, v) < 0) {
                Py_XDECREF(v);
                Py_DECREF(k);
                goto fail;
            }
        }
        Py_DECREF(k);
        PyList_SET_ITEM(out, j, v);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* -- 5. the miss ledger's stored-before run ------------------------------------------------- */

PyDoc_STRVAR(stored_run_doc,
"stored_run(keys, start, stop, ever, mine, others) -> (end, break_routing, here, elsewhere,\n"
"                                                      capacity)\n\n"
"replay/ledger.py MissLedger.classify's run 1 in one pass: ``end`` the first index from\n"
"``start`` (below ``stop``) whose key is not in the set ``ever``; for the run's first key,\n"
"whether a dict of ``others`` holds it; for each later key of the run, counted once: held by\n"
"``mine`` (here), else by one of ``others`` (elsewhere), else by none (capacity).");

static PyObject *
stored_run(PyObject *self, PyObject *args)
{
    PyObject *keys, *ever, *mine, *others;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "O!nnO!O!O!", &PyList_Type, &keys, &start, &stop, &PySet_Type,
                          &ever, &PyDict_Type, &mine, &PyList_Type, &others))
        return NULL;
    Py_ssize_t nothers = PyList_GET_SIZE(others);
    for (Py_ssize_t i = 0; i < nothers; i++)
        if (!PyDict_Check(PyList_GET_ITEM(others, i))) {
            PyErr_SetString(PyExc_TypeError, "stored_run: others must be dicts");
            return NULL;
        }
    if (start < 0) {
        PyErr_SetString(PyExc_ValueError, "stored_run: start >= 0");
        return NULL;
    }
    Py_ssize_t end = start, here = 0, elsewhere = 0, capacity = 0;
    int break_routing = 0;
    Py_INCREF(others);
    for (; end < stop && end < PyList_GET_SIZE(keys); end++) {
        PyObject *k = PyList_GET_ITEM(keys, end);
        Py_INCREF(k);
        int r = PySet_Contains(ever, k);
        if (r <= 0) {
            Py_DECREF(k);
            if (r < 0)
                goto fail;
            break;
        }
        int held = 0;
        if (end > start) {
            held = PyDict_Contains(mine, k);
            if (held < 0) {
                Py_DECREF(k);
                goto fail;
            }
        }
        if (held) {
            here++;
        } else {
            int found = 0;
            for (Py_ssize_t i = 0; i < nothers && i < PyList_GET_SIZE(others); i++) {
                found = PyDict_Contains(PyList_GET_ITEM(others, i), k);
                if (found < 0) {
                    Py_DECREF(k);
                    goto fail;
                }
                if (found)
                    break;
            }
            if (end == start)
                break_routing = found;
            else if (found)
                elsewhere++;
            else
                capacity++;
        }
        Py_DECREF(k);
    }
    Py_DECREF(others);
    return Py_BuildValue("nOnnn", end, break_routing ? Py_True : Py_False, here, elsewhere,
                         capacity);
fail:
    Py_DECREF(others);
    return NULL;
}

static PyMethodDef methods[] = {
    {"sha256_pickle_chain", sha256_pickle_chain, METH_VARARGS, sha256_pickle_chain_doc},
    {"run_alone", run_alone, METH_VARARGS, run_alone_doc},
    {"min_hits", min_hits, METH_VARARGS, min_hits_doc},
    {"intern_keys", intern_keys, METH_VARARGS, intern_keys_doc},
    {"stored_run", stored_run, METH_VARARGS, stored_run_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native",
    "The hot loops of sequential replay in C (block hashing, BlockPool.run_alone, the miss "
    "ledger's content index and stored run, Belady's MIN); "
    "see prefixscope.replay.native.", -1, methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    MINUS_ONE = PyLong_FromLong(-1);
    MINUS_TWO = PyLong_FromLong(-2);
    if (MINUS_ONE == NULL || MINUS_TWO == NULL)
        return NULL;
    if (PyType_Ready(&ContentIndexType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ContentIndexType);
    if (PyModule_AddObject(m, "ContentIndex", (PyObject *)&ContentIndexType) < 0) {
        Py_DECREF(&ContentIndexType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
