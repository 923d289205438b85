// What both paged-attention kernels (paged_attention.cu on CUDA cores, paged_attention_tc.cu on
// tensor cores) share: the host's work items and how a block finds its keys.
#pragma once
#include "portable.h"

// One work item: a sequence and the rows [row0, row0 + rows) of its new tokens. The host's plan
// (kernels/src/gpu/paged.rs) lays these out; one list serves both kernels.
struct Item {
  int seq;
  int row0;
  int rows;
};

// Where a block's item sits and which keys its split reads.
struct ItemKeys {
  int first;               // the item's sequence's first query row in q
  int t;                   // that sequence's query rows this step
  int ctx;                 // its context, the new rows included
  const unsigned* table;   // its block table
  int k0, k1;              // this split's keys [k0, k1); empty when k0 ≥ k1
};

// The keys of `split` among `splits`: the keys the item may see at all (up to its last row's
// position) cut into near-equal parts of whole `granule`s (the kernel's tile). The cut is made
// here from the real context, not on the host: a decode step replayed as a graph is planned for
// `max_model_len`, and a fixed part of that length left the last split short and the first long
// at every shorter context.
DEV ItemKeys item_keys(const Item& it, const unsigned* query_starts, const unsigned* context_lens,
                       const unsigned* tables, int max_blocks, int granule, int split, int splits) {
  ItemKeys k;
  k.first = query_starts[it.seq];
  k.t = query_starts[it.seq + 1] - k.first;
  k.ctx = context_lens[it.seq];
  k.table = tables + (size_t)it.seq * max_blocks;
  const int keys = k.ctx - k.t + it.row0 + it.rows;
  const int part = (keys + granule * splits - 1) / (granule * splits) * granule;
  k.k0 = split * part;
  k.k1 = min(keys, k.k0 + part);
  return k;
}
