/*
 * graph.c - the graph of a compute: every tensor reachable from the outputs
 * through sources and view sources, each once, in an order where a tensor
 * comes after everything it reads. Iterative (no recursion depth limit);
 * arrays are kept between computes so a graph no larger than an earlier one
 * allocates nothing. Matmuls of one activation tensor (Q, K and V of a
 * layer; gate and up) are then made neighbours where the order allows it
 * (cluster), so that a device can run them together.
 */
#include "core.h"

static tsr_status push_tensor(tsr_tensor ***arr, size_t *n, size_t *cap, tsr_tensor *t) {
    if (!tsr__grow((void **)arr, cap, *n + 1, sizeof **arr))
        return tsr__error(TSR_E_NOMEM, "out of host memory building the graph (%zu nodes)", *n + 1);
    (*arr)[(*n)++] = t;
    return TSR_OK;
}

/* Children of t in a fixed order: sources, then the view source. */
static tsr_tensor *child(tsr_tensor *t, int i) {
    if (i < TSR_MAX_SRC)
        return t->src[i];
    if (i == TSR_MAX_SRC)
        return t->view_src;
    return NULL;
}

#define TSR_N_CHILDREN (TSR_MAX_SRC + 1)

static tsr_status emit(tsr_graph *g, tsr_tensor *t) {
    if (t->op == TSR_OP_NONE)
        return push_tensor(&g->leafs, &g->n_leafs, &g->cap_leafs, t);
    if (t->op == TSR_OP_VIEW)
        return push_tensor(&g->views, &g->n_views, &g->cap_views, t);
    return push_tensor(&g->nodes, &g->n_nodes, &g->cap_nodes, t);
}

typedef struct tsr_frame {
    tsr_tensor *t;
    int next;
} tsr_frame;

static tsr_status stack_reserve(tsr_graph *g, size_t n) {
    if (!tsr__grow(&g->stack, &g->cap_stack, n, sizeof(tsr_frame)))
        return tsr__error(TSR_E_NOMEM, "out of host memory building the graph");
    return TSR_OK;
}

static tsr_status visit(tsr_graph *g, tsr_tensor *root, uint32_t mark) {
    if (root->visit_mark == mark)
        return TSR_OK;
    size_t sp = 0;
    tsr_status s = stack_reserve(g, 1);
    if (s != TSR_OK)
        return s;
    root->visit_mark = mark;
    ((tsr_frame *)g->stack)[sp++] = (tsr_frame){root, 0};
    while (sp > 0) {
        tsr_frame *f = &((tsr_frame *)g->stack)[sp - 1];
        if (f->next >= TSR_N_CHILDREN) {
            if ((s = emit(g, f->t)) != TSR_OK)
                return s;
            sp--;
            continue;
        }
        tsr_tensor *c = child(f->t, f->next++);
        if (!c || c->visit_mark == mark)
            continue;
        c->visit_mark = mark;
        if ((s = stack_reserve(g, sp + 1)) != TSR_OK)
            return s;
        ((tsr_frame *)g->stack)[sp++] = (tsr_frame){c, 0};
    }
    return TSR_OK;
}

/* ---- matmuls of one activation made neighbours ------------------------------ */

#define CLUSTER_AHEAD 16 /* nodes looked past for a matmul of the same activations */

/* Whether node b may run before nodes[from, to) (b = nodes[to]): none of
 * them is b's source or a view source on the way to one, and none writes in
 * place into storage b reads (b itself writes only its own). */
static bool may_hoist(tsr_tensor *const *nodes, size_t from, size_t to) {
    const tsr_tensor *b = nodes[to];
    if (b->view_src)
        return false;
    for (size_t m = from; m < to; m++) {
        tsr_tensor *n = nodes[m];
        const tsr_tensor *nroot = n->view_src ? tsr__view_root(n) : NULL;
        for (int j = 0; j < TSR_MAX_SRC; j++)
            for (const tsr_tensor *t = b->src[j]; t; t = t->view_src)
                if (t == n || (nroot && t == nroot))
                    return false;
    }
    return true;
}

/* After each matmul, the matmuls of the same activation tensor found within
 * CLUSTER_AHEAD nodes move up to follow it, when nothing they skip is theirs
 * to wait for (may_hoist); the order stays topological. */
static void cluster(tsr_graph *g) {
    tsr_tensor **nodes = g->nodes;
    for (size_t i = 0; i < g->n_nodes; i++) {
        const tsr_tensor *a = nodes[i];
        if (a->op != TSR_OP_MUL_MAT || !a->src[1])
            continue;
        size_t end = i + 1; /* the group is nodes[i, end) */
        for (size_t j = end; j < g->n_nodes && j <= end + CLUSTER_AHEAD; j++) {
            tsr_tensor *b = nodes[j];
            if (b->op != TSR_OP_MUL_MAT || b->src[1] != a->src[1])
                continue;
            if (j > end) {
                if (!may_hoist(nodes, end, j))
                    continue;
                memmove(nodes + end + 1, nodes + end, (j - end) * sizeof *nodes);
                nodes[end] = b;
            }
            end++;
        }
        i = end - 1;
    }
}

tsr_status tsr__graph_build(tsr_graph *g, tsr_tensor *const *outs, size_t n_outs, uint32_t mark) {
    g->n_nodes = g->n_leafs = g->n_views = 0;
    for (size_t i = 0; i < n_outs; i++) {
        tsr_status s = visit(g, outs[i], mark);
        if (s != TSR_OK)
            return s;
    }
    cluster(g);
    return TSR_OK;
}

void tsr__graph_free(tsr_graph *g) {
    tsr__free(g->nodes);
    tsr__free(g->leafs);
    tsr__free(g->views);
    tsr__free(g->stack);
    memset(g, 0, sizeof *g);
}
